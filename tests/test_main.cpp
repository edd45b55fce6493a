// main() of every test executable: GoogleTest's, after one test-only switch.
//
// S3R_TEST_CAP=CAP (set by ctest on the capped reruns, tests/CMakeLists.txt) makes this process
// behave as a CPU capped at CAP with the library's own choices: S3R_MAX_ISA=CAP, and any
// S3R_ISA / S3R_GEMM_INT8 / S3R_GEMM_BF16 of the caller's environment removed (they would ask
// for a tier or backend that the capped process may not have, or hide its own choice). ctest
// passes only one variable through gtest_discover_tests' PROPERTIES reliably, hence this switch.
#include <gtest/gtest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  if (const char* cap = std::getenv("S3R_TEST_CAP"); cap != nullptr && *cap != '\0') {
    setenv("S3R_MAX_ISA", cap, 1);
    for (const char* name : {"S3R_ISA", "S3R_GEMM_INT8", "S3R_GEMM_BF16"}) unsetenv(name);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
