// `s3r bench cores`: the core check alone (s3r/gemm/roofline.hpp), for a script that times other
// programs between its runs: how much of its cores this process had just now. scripts/
// bench_peer.sh runs it before and after each job and runs a job again when it reads low, as it
// does when other processes took the CPUs.
#include <omp.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "option_checks.hpp"
#include "s3r/gemm/machine_line.hpp"
#include "s3r/gemm/roofline.hpp"
#include "s3r/io/atomic_file.hpp"

namespace s3r::tools {
namespace {

struct Options {
  int samples = 5;
  double gap_ms = 20;
  int threads = 0;  // 0: OpenMP's default
  std::string json_path;
};

void run(const Options& o) {
  if (!o.json_path.empty()) check_output_file("bench cores", "--json", o.json_path);
  if (o.threads > 0) omp_set_num_threads(o.threads);
  const std::vector<double> samples = gemm::core_check_now(o.samples, o.gap_ms * 1e-3);
  const double median = gemm::core_check_median(samples);
  if (median < 0) {
    std::printf("cores: no core check on this CPU (it needs AVX2)\n");
  } else {
    std::printf("%s\n", gemm::core_check_line(samples, "now").c_str());
    // Its reference ran slow: other processes took the CPUs from its threads for part of it.
    if (median > 1.15) std::printf("cores: above 1: something else took the CPUs while the reference ran\n");
  }
  if (o.json_path.empty()) return;
  nlohmann::json j;
  j["threads"] = omp_get_max_threads();
  j["machine"] = machine_line();
  j["samples"] = samples;
  j["median"] = median < 0 ? nlohmann::json() : nlohmann::json(median);
  io::write_file_atomic(o.json_path, [&](std::ostream& out) { out << j.dump(1) << "\n"; });
}

}  // namespace

void register_bench_cores(CLI::App& bench) {
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand(
      "cores", "the core check alone: whether this process has its cores to itself now (about 1) "
               "or shares them, e.g. with a VM's co-tenant (lower)");
  add_integer_option(cmd, "--samples", opts->samples, "checks, each about 2 ms on every thread", 1, 1000);
  add_float_option(cmd, "--gap-ms", opts->gap_ms, "milliseconds between checks", 0.0, 10000.0);
  add_integer_option(cmd, "--threads", opts->threads, "OpenMP threads (0: all cores)", 0, omp_get_num_procs(),
                     "0: all of the " + std::to_string(omp_get_num_procs()) + " processors");
  cmd->add_option("--json", opts->json_path, "also write the samples and their median as JSON to this file");
  cmd->callback([opts] { run(*opts); });
}

}  // namespace s3r::tools
