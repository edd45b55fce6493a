#pragma once
// s3r::Error: the one exception type of the library. Messages name the file, option, layer or
// tensor at fault, the expected and the actual value, and a hint where one helps. The library
// never calls exit()/abort(); tools catch at main, print one line and return non-zero.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace s3r {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A NaN or Inf met in a tensor (an activation, a weight or a gradient): the trainer skips the
// step (and stops after too many in a row) instead of failing on the spot.
class NonFiniteError : public Error {
 public:
  using Error::Error;
};

// Throws Error("FN: WHAT has SIZE elements, expected EXPECTED") unless size == expected: the
// size check of every layer's spans.
inline void expect_size(const char* fn, const char* what, size_t size, int64_t expected) {
  if (expected < 0 || size != static_cast<size_t>(expected)) {
    throw Error(std::string(fn) + ": " + what + " has " + std::to_string(size) + " elements, expected " +
                std::to_string(expected));
  }
}

}  // namespace s3r
