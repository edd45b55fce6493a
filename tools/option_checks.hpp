#pragma once
// Checks of command-line values made as they are parsed, and of output files made before the
// work starts, so that a bad value or an unwritable path is one clear s3r::Error at once rather
// than a wrong run or a failure at the end of a long one.
//
// CLI11's own conversion is too lenient for these options: it reads "nan" and "inf" into a
// float, "010" as octal 8 and "0x10" as 16 into an integer, and does not say which command an
// option belongs to. The options below are parsed here instead: a plain decimal number, read
// completely, finite, and within [min, max]; any violation throws s3r::Error naming the command,
// the option and the value ("bench step: --batch must be >= 1, got 0"), which `s3r` prints as
// one line with exit status 1.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>

namespace s3r::tools {

// "bench step" for the subcommand `s3r bench step`, "train" for `s3r train`.
std::string command_path(const CLI::App* cmd);

// TEXT as a decimal integer (an optional sign, digits, nothing else) in [min, max]; `note` is
// appended to a range error to say what a boundary means, e.g. "0: all cores". Throws s3r::Error
// "COMMAND: OPTION must be >= MIN[ (NOTE)], got VALUE" (or "<= MAX", or "must be an integer").
int64_t parse_integer_option(const std::string& command, const std::string& option, const std::string& text,
                             int64_t min, int64_t max, const std::string& note = "");

// TEXT as a finite decimal floating-point number in [min, max] (NaN, Inf and overflow refused).
double parse_float_option(const std::string& command, const std::string& option, const std::string& text,
                          double min, double max, const std::string& note = "");

// Registers OPTION on CMD for VALUE (int, int64_t, uint32_t, ... or std::optional of one: set
// only when given): parsed by parse_integer_option at parse time. The default shown in --help is
// VALUE's current value (nothing for an empty optional).
template <class T>
CLI::Option* add_integer_option(CLI::App* cmd, const std::string& option, T& value, const std::string& description,
                                int64_t min, int64_t max = std::numeric_limits<int64_t>::max(),
                                const std::string& note = "") {
  CLI::Option* opt = cmd->add_option_function<std::string>(
      option,
      [cmd, option, &value, min, max, note](const std::string& text) {
        const int64_t v = parse_integer_option(command_path(cmd), option, text, min, max, note);
        if constexpr (requires { typename T::value_type; }) {
          value = static_cast<typename T::value_type>(v);
        } else {
          value = static_cast<T>(v);
        }
      },
      description);
  opt->type_name("INT");
  if constexpr (!requires { typename T::value_type; }) opt->default_str(std::to_string(value));
  return opt;
}

// As add_integer_option for a float or double VALUE, through parse_float_option.
template <class T>
CLI::Option* add_float_option(CLI::App* cmd, const std::string& option, T& value, const std::string& description,
                              double min, double max = std::numeric_limits<double>::max(),
                              const std::string& note = "") {
  CLI::Option* opt = cmd->add_option_function<std::string>(
      option,
      [cmd, option, &value, min, max, note](const std::string& text) {
        value = static_cast<T>(parse_float_option(command_path(cmd), option, text, min, max, note));
      },
      description);
  opt->type_name("FLOAT");
  opt->default_str(std::to_string(value));
  return opt;
}

// An output file written only at the end of a command (`--json`): checks now that it can be
// written then. Its folder is created when missing (like mkdir -p), PATH must not be a folder, and
// the temporary PATH.tmp that io::write_file_atomic writes is created and removed as a probe.
// Throws s3r::Error "COMMAND: OPTION 'PATH': REASON" (no such folder and none can be made, not a
// folder, permission denied, read-only file system...).
void check_output_file(const std::string& command, const std::string& option, const std::string& path);

}  // namespace s3r::tools
