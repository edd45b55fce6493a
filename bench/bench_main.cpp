// Shared main of the s3r micro-benchmarks: Google Benchmark's usual flags, plus the machine
// context (CPU model, active ISA, AVX-512, OpenMP threads, build) printed in the header of the
// console output and stored in the "context" object of --benchmark_out JSON files.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <exception>
#include <iostream>
#include <string>

#include "s3r/core/cpu_features.hpp"
#include "s3r/core/isa.hpp"
#include "s3r/core/machine.hpp"
#include "s3r/gemm/machine_line.hpp"

#ifndef S3R_BUILD_TYPE
#define S3R_BUILD_TYPE "unknown"
#endif


int main(int argc, char** argv) {
  try {
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::AddCustomContext("cpu_model", s3r::cpu_model_name());
    benchmark::AddCustomContext("s3r_active_isa", std::string(s3r::isa_name(s3r::active_isa())));
    benchmark::AddCustomContext("s3r_cpu_features", s3r::describe(s3r::cpu_features()));
    benchmark::AddCustomContext("s3r_machine", s3r::machine_line());
    benchmark::AddCustomContext("omp_max_threads", std::to_string(omp_get_max_threads()));
    benchmark::AddCustomContext("omp_num_procs", std::to_string(omp_get_num_procs()));
    benchmark::AddCustomContext("s3r_build_type", S3R_BUILD_TYPE);
    benchmark::AddCustomContext("compiler", __VERSION__);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
  } catch (const std::exception& e) {
    std::cerr << "s3r bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
