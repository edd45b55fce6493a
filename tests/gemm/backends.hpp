#pragma once
// The GEMM backends a test runs: every one this process can run (int8: reference first); each one
// it cannot run is recorded as skipped on the running test, with the reason (never a silent pass
// of fewer backends).
#include <gtest/gtest.h>

#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "s3r/gemm/backend.hpp"

namespace s3r::testing {

template <class Backend>
std::vector<Backend> runnable_backends(std::initializer_list<Backend> all, bool (*available)(Backend, std::string*),
                                       const char* type) {
  std::vector<Backend> out;
  for (Backend b : all) {
    std::string why;
    if (available(b, &why)) {
      out.push_back(b);
    } else {
      const std::string name(to_string(b));
      ::testing::Test::RecordProperty("skipped_" + std::string(type) + "_backend_" + name, why);
      std::printf("[ SKIPPED BACKEND ] %s %s: %s\n", type, name.c_str(), why.c_str());
    }
  }
  return out;
}

inline std::vector<gemm::Int8Backend> int8_backends() {
  using gemm::Int8Backend;
  return runnable_backends({Int8Backend::kReference, Int8Backend::kAvx2, Int8Backend::kOnednn, Int8Backend::kAmx,
                            Int8Backend::kVnni},
                           &gemm::int8_backend_available, "int8");
}

inline std::vector<gemm::Bf16Backend> bf16_backends() {
  using gemm::Bf16Backend;
  return runnable_backends({Bf16Backend::kF32, Bf16Backend::kOnednn, Bf16Backend::kDpbf16, Bf16Backend::kAmx}, &gemm::bf16_backend_available, "bf16");
}

}  // namespace s3r::testing
