// The `s3r` command. Errors: one line on stderr and a non-zero exit.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>
#include <memory>
#include <string>

#include "commands.hpp"
#include "s3r/core/error.hpp"

int main(int argc, char** argv) {
  // MPI (when mpirun started this process) is initialised before anything else and finalised
  // at the end of main; an error on any rank ends every rank (docs/DISTRIBUTED.md).
  std::unique_ptr<s3r::dist::Communicator> world;
  try {
    world = s3r::dist::world(&argc, &argv);
  } catch (const s3r::Error& e) {
    std::cerr << "s3r: error: " << e.what() << "\n";
    return 1;
  }
  const auto fail = [&](const char* kind, const char* what, int code) {
    if (world->size() > 1) {  // MPI_Abort: does not return
      // One write, so that another rank's abort banner cannot land inside the line.
      const std::string line = "s3r: " + std::string(kind) + " on rank " + std::to_string(world->rank()) + " of " +
                               std::to_string(world->size()) + ": " + what + "\ns3r: stopping every rank\n";
      std::cerr.write(line.data(), static_cast<std::streamsize>(line.size()));
      std::cerr.flush();
      world->stop_every_rank(code);
    }
    std::cerr << "s3r: " << kind << ": " << what << "\n";
    return code;
  };
  CLI::App app{"s3r: INT8 training with structured shared-randomness stochastic rounding"};
  app.require_subcommand(1);
  CLI::App* bench = app.add_subcommand("bench", "benchmarks against the bf16 baseline");
  bench->require_subcommand(1);
  s3r::tools::register_bench_ffn(*bench);
  s3r::tools::register_bench_step(*bench);
  s3r::tools::register_bench_cores(*bench);
  CLI::App* data = app.add_subcommand("data", "prepare training data");
  data->require_subcommand(1);
  s3r::tools::register_data_prepare(*data);
  s3r::tools::register_train(app, *world);
  s3r::tools::register_generate(app);
  s3r::tools::register_eval(app);
  s3r::tools::register_export(app);
  CLI::App* diag = app.add_subcommand("diag", "diagnostics of the rounding on a trained checkpoint");
  diag->require_subcommand(1);
  s3r::tools::register_diag_grad_error(*diag);
  s3r::tools::register_diag_second_moment(*diag);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (world->rank() != 0 && e.get_exit_code() == 0) return 0;  // --help: printed by rank 0
    if (e.get_exit_code() == 0) return world->rank() == 0 ? app.exit(e) : 0;  // --help, --version
    // Bad command lines (an unknown option, a missing value) are one line and exit 1, as every
    // other bad input.
    return fail("error", (std::string(e.what()) + " (--help lists the options)").c_str(), 1);
  } catch (const s3r::Error& e) {
    return fail("error", e.what(), 1);
  } catch (const std::exception& e) {
    return fail("internal error", e.what(), 2);
  }
  return 0;
}
