#pragma once
// The int8 GEMM backends a test runs: every one this process can run, reference first; each one it
// cannot run is recorded as skipped on the running test, with the reason (never a silent pass of
// fewer backends).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "s3r/gemm/backend.hpp"

namespace s3r::testing {

inline std::vector<gemm::Int8Backend> int8_backends() {
  std::vector<gemm::Int8Backend> out;
  using gemm::Int8Backend;
  for (Int8Backend b : {Int8Backend::kReference, Int8Backend::kAvx2, Int8Backend::kOnednn, Int8Backend::kAmx,
                        Int8Backend::kVnni}) {
    std::string why;
    if (int8_backend_available(b, &why)) {
      out.push_back(b);
    } else {
      ::testing::Test::RecordProperty("skipped_int8_backend_" + std::string(to_string(b)), why);
      std::printf("[ SKIPPED BACKEND ] int8 %s: %s\n", std::string(to_string(b)).c_str(), why.c_str());
    }
  }
  return out;
}

}  // namespace s3r::testing
