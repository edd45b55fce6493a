// The `s3r` command. Errors: one line on stderr and a non-zero exit.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>

#include "commands.hpp"
#include "s3r/core/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"s3r: INT8 training with structured shared-randomness stochastic rounding"};
  app.require_subcommand(1);
  CLI::App* bench = app.add_subcommand("bench", "benchmarks against the bf16 baseline");
  bench->require_subcommand(1);
  s3r::tools::register_bench_ffn(*bench);
  s3r::tools::register_bench_step(*bench);
  CLI::App* data = app.add_subcommand("data", "prepare training data");
  data->require_subcommand(1);
  s3r::tools::register_data_prepare(*data);
  s3r::tools::register_train(app);
  s3r::tools::register_generate(app);
  s3r::tools::register_eval(app);
  s3r::tools::register_export(app);
  CLI::App* diag = app.add_subcommand("diag", "diagnostics of the rounding on a trained checkpoint");
  diag->require_subcommand(1);
  s3r::tools::register_diag_grad_error(*diag);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const s3r::Error& e) {
    std::cerr << "s3r: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "s3r: internal error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
