#pragma once
// safetensors files (the format of Hugging Face's `safetensors`): an 8-byte little-endian header
// length, a JSON header {name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]},
// "__metadata__": {string: string}}, then the tensors' bytes. s3r writes and reads F32 tensors.
// Writes go to a temporary name and are renamed into place. Reads validate before allocating:
// the header length (within the file and at most 100 MB), the header a JSON object, each
// tensor's "dtype" (F32), "shape" (non-negative integers whose product fits) and "data_offsets"
// (two non-negative integers within the data, spanning the shape's bytes), "__metadata__" an
// object of strings, and the tensors tiling the data exactly (no overlap, no hole, no trailing
// bytes, as the format requires). Every fault is an s3r::Error naming the file and the tensor or
// field.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>
#include "s3r/core/aligned_vector.hpp"

namespace s3r::io {

struct TensorView {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> data;  // row-major; size = product of shape
};

void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  struct Tensor {
    std::vector<int64_t> shape;
    AlignedVector<float> data;
  };
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

SafetensorsFile read_safetensors(const std::string& path);

}  // namespace s3r::io
