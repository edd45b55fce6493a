#include "s3r/io/safetensors.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "s3r/core/error.hpp"
#include "s3r/io/atomic_file.hpp"

namespace s3r::io {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error("safetensors file '" + path + "': " + what);
}

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header;
  int64_t offset = 0;
  for (const TensorView& t : tensors) {
    if (element_count(t.shape) != static_cast<int64_t>(t.data.size())) {
      fail(path, "tensor '" + t.name + "' has " + std::to_string(t.data.size()) +
                     " values but its shape holds " + std::to_string(element_count(t.shape)));
    }
    const int64_t bytes = static_cast<int64_t>(t.data.size() * sizeof(float));
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // keeps the data 8-byte aligned
  write_file_atomic(path, [&](std::ostream& out) {
    const uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const TensorView& t : tensors) {
      out.write(reinterpret_cast<const char*>(t.data.data()),
                static_cast<std::streamsize>(t.data.size() * sizeof(float)));
    }
  });
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) fail(path, "cannot open: " + ec.message());
  if (size < 8) fail(path, "is " + std::to_string(size) + " bytes, too short for a header");
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (n > size - 8) fail(path, "header length " + std::to_string(n) + " exceeds the file (truncated?)");
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail(path, std::string("header is not valid JSON: ") + e.what());
  }
  const uintmax_t data_size = size - 8 - n;
  SafetensorsFile file;
  std::vector<char> data(data_size);
  in.read(data.data(), static_cast<std::streamsize>(data_size));
  if (!in) fail(path, "read failed");
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : entry.items()) file.metadata[k] = v.get<std::string>();
      continue;
    }
    if (!entry.contains("dtype") || entry["dtype"] != "F32") fail(path, "tensor '" + name + "' is not F32");
    SafetensorsFile::Tensor t;
    t.shape = entry.at("shape").get<std::vector<int64_t>>();
    const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
    const uint64_t bytes = static_cast<uint64_t>(element_count(t.shape)) * sizeof(float);
    if (offsets.size() != 2 || offsets[1] < offsets[0] || offsets[1] - offsets[0] != bytes ||
        offsets[1] > data_size) {
      fail(path, "tensor '" + name + "' has data offsets outside the file or unequal to its shape");
    }
    t.data.resize(static_cast<size_t>(element_count(t.shape)));
    std::memcpy(t.data.data(), data.data() + offsets[0], bytes);
    file.tensors.emplace(name, std::move(t));
  }
  return file;
}

}  // namespace s3r::io
