// libFuzzer target: bytes -> a .safetensors file -> io::read_safetensors
// (include/s3r/io/safetensors.hpp). A file that reads must be consistent: each tensor holds the
// product of its shape, no dimension negative.
#include <cstdint>
#include <cstdlib>

#include "fuzz_util.hpp"
#include "s3r/core/error.hpp"
#include "s3r/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = s3r::fuzz::scratch() / "model.safetensors";
  s3r::fuzz::write_file(path, s3r::fuzz::as_view(data, size));
  try {
    const s3r::io::SafetensorsFile file = s3r::io::read_safetensors(path.string());
    for (const auto& [name, tensor] : file.tensors) {
      uint64_t elements = 1;
      for (int64_t d : tensor.shape) {
        if (d < 0) std::abort();
        elements *= static_cast<uint64_t>(d);  // bounded by the reader (at most 2^61)
      }
      if (elements != tensor.data.size()) std::abort();
    }
  } catch (const s3r::Error&) {
  }
  return 0;
}
