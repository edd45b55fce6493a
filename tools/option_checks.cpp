// Command-line value and output-path checks; see option_checks.hpp.
#include "option_checks.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "s3r/core/error.hpp"

namespace s3r::tools {

namespace {

std::string format_number(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

[[noreturn]] void range_error(const std::string& command, const std::string& option, const std::string& bound,
                              const std::string& note, const std::string& text) {
  throw Error(command + ": " + option + " must be " + bound + (note.empty() ? "" : " (" + note + ")") +
              ", got " + text);
}

}  // namespace

std::string command_path(const CLI::App* cmd) {
  std::string path = cmd->get_name();
  for (const CLI::App* p = cmd->get_parent(); p != nullptr && p->get_parent() != nullptr; p = p->get_parent()) {
    path = p->get_name() + " " + path;
  }
  return path;
}

int64_t parse_integer_option(const std::string& command, const std::string& option, const std::string& text,
                             int64_t min, int64_t max, const std::string& note) {
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (first != last && *first == '+') ++first;  // from_chars takes '-' but not '+'
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(first, last, v);
  if (ec == std::errc::result_out_of_range) {
    range_error(command, option, text[0] == '-' ? ">= " + std::to_string(min) : "<= " + std::to_string(max), note,
                text);
  }
  if (ec != std::errc() || end != last || first == last) {
    throw Error(command + ": " + option + " must be an integer, got '" + text + "'");
  }
  if (v < min) range_error(command, option, ">= " + std::to_string(min), note, text);
  if (v > max) range_error(command, option, "<= " + std::to_string(max), note, text);
  return v;
}

double parse_float_option(const std::string& command, const std::string& option, const std::string& text,
                          double min, double max, const std::string& note) {
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (first != last && *first == '+') ++first;
  double v = 0.0;
  const auto [end, ec] = std::from_chars(first, last, v);
  if (ec != std::errc() || end != last || first == last || !std::isfinite(v)) {
    // from_chars reads "nan" and "inf" too; both are refused here, as is an overflow.
    throw Error(command + ": " + option + " must be a finite number, got '" + text + "'");
  }
  if (v < min) range_error(command, option, ">= " + format_number(min), note, text);
  if (v > max) range_error(command, option, "<= " + format_number(max), note, text);
  return v;
}

void check_output_file(const std::string& command, const std::string& option, const std::string& path) {
  namespace fs = std::filesystem;
  const std::string where = command + ": " + option + " '" + path + "': ";
  if (path.empty()) throw Error(where + "an empty path");
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw Error(where + "is a folder; give a file name");
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, ec);  // nothing to do (and no error) when it exists
    if (ec || !fs::is_directory(parent)) {
      throw Error(where + "cannot create its folder '" + parent.string() + "'" +
                  (ec ? ": " + ec.message() : ": not a folder"));
    }
  }
  // The probe: the very file write_file_atomic will open, created and removed again.
  const std::string tmp = path + ".tmp";
  const bool existed = fs::exists(tmp, ec);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(where + "cannot write '" + tmp + "' there: " + std::strerror(errno));
  ::close(fd);
  if (!existed) ::unlink(tmp.c_str());
}

}  // namespace s3r::tools
