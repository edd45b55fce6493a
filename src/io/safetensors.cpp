#include "s3r/io/safetensors.hpp"

#include <algorithm>
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

// The format's own limit (Hugging Face's reader refuses larger headers): a corrupt length never
// sizes an allocation past it.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// 2^61 values: their F32 bytes still fit in int64.
constexpr uint64_t kMaxElements = uint64_t{1} << 61;

// A JSON value for an error message, cut to a line's worth.
std::string brief(const nlohmann::json& j) {
  std::string text = j.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
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

namespace {

// One tensor's entry of the header, validated.
struct Entry {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

// The header's JSON object, after the 8-byte length (checked against the file's size and the
// format's limit); n: the header's length.
nlohmann::json read_header(const std::string& path, std::ifstream& in, uintmax_t size, uint64_t& n) {
  in.read(reinterpret_cast<char*>(&n), 8);
  if (!in) fail(path, "cannot read the 8-byte header length");
  if (n > size - 8) fail(path, "header length " + std::to_string(n) + " exceeds the file (truncated?)");
  if (n > kMaxHeaderBytes) {
    fail(path, "header length " + std::to_string(n) + " exceeds the format's limit of " +
                   std::to_string(kMaxHeaderBytes) + " bytes (corrupt?)");
  }
  std::string text(static_cast<size_t>(n), '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  if (!in) fail(path, "cannot read the " + std::to_string(n) + "-byte header");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) {
    fail(path, std::string("header is a JSON ") + header.type_name() + ", expected an object");
  }
  return header;
}

// "__metadata__": an object of strings.
void read_metadata(const std::string& path, const nlohmann::json& entry, std::map<std::string, std::string>& out) {
  if (!entry.is_object()) {
    fail(path, std::string("\"__metadata__\" is a JSON ") + entry.type_name() + ", expected an object of strings");
  }
  for (const auto& [k, v] : entry.items()) {
    if (!v.is_string()) {
      fail(path, "\"__metadata__\" field '" + k + "' is a JSON " + v.type_name() + ", expected a string");
    }
    out[k] = v.get<std::string>();
  }
}

// The dimensions of "shape" into e.shape; returns the F32 bytes they hold. The product of the
// non-zero dimensions must fit in int64 (so that any caller's product of any subset does too)
// and the bytes in uint64.
uint64_t read_shape(const std::string& path, const std::string& what, const nlohmann::json& shape, Entry& e) {
  if (!shape.is_array()) {
    fail(path, what + ": \"shape\" is a JSON " + shape.type_name() + ", expected an array of non-negative integers");
  }
  uint64_t nonzero_product = 1;
  bool has_zero = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    const nlohmann::json& d = shape[i];
    if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0)) {
      fail(path, what + ": \"shape\"[" + std::to_string(i) + "] is " + brief(d) + ", expected a non-negative integer");
    }
    const uint64_t dim = d.get<uint64_t>();
    if (dim == 0) {
      has_zero = true;
    } else if (nonzero_product > kMaxElements / dim) {
      fail(path, what + ": \"shape\" " + brief(shape) + " holds more than 2^61 values (corrupt?)");
    } else {
      nonzero_product *= dim;
    }
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  return has_zero ? 0 : nonzero_product * sizeof(float);
}

// A tensor's entry: an F32 dtype, its shape, and data offsets within the data_size bytes that
// match the shape's bytes.
Entry read_entry(const std::string& path, const std::string& name, const nlohmann::json& entry, uint64_t data_size) {
  const std::string what = "tensor '" + name + "'";
  if (!entry.is_object()) fail(path, what + " is a JSON " + entry.type_name() + ", expected an object");
  const auto dtype = entry.find("dtype");
  if (dtype == entry.end()) fail(path, what + " has no \"dtype\"");
  if (!dtype->is_string()) fail(path, what + ": \"dtype\" is a JSON " + dtype->type_name() + ", expected a string");
  if (dtype->get<std::string>() != "F32") {
    fail(path, what + " has dtype \"" + dtype->get<std::string>() + "\"; s3r reads only F32");
  }
  Entry e;
  e.name = name;
  const auto shape = entry.find("shape");
  if (shape == entry.end()) fail(path, what + " has no \"shape\"");
  const uint64_t bytes = read_shape(path, what, *shape, e);
  const auto offsets = entry.find("data_offsets");
  if (offsets == entry.end()) fail(path, what + " has no \"data_offsets\"");
  if (!offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned()) {
    fail(path, what + ": \"data_offsets\" is " + brief(*offsets) +
                   ", expected [begin, end], two non-negative integers");
  }
  e.begin = (*offsets)[0].get<uint64_t>();
  e.end = (*offsets)[1].get<uint64_t>();
  const std::string range = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
  if (e.end < e.begin) fail(path, what + " has data offsets " + range + ": the end is before the begin");
  if (e.end > data_size) {
    fail(path, what + " has data offsets " + range + " outside the file's " + std::to_string(data_size) +
                   " data bytes (truncated?)");
  }
  if (e.end - e.begin != bytes) {
    fail(path, what + " has data offsets " + range + " (" + std::to_string(e.end - e.begin) +
                   " bytes), but its shape " + brief(*shape) + " of F32 needs " + std::to_string(bytes) + " bytes");
  }
  return e;
}

// The entries in the order of their data, which must tile the data_size bytes exactly (the format
// forbids holes and overlaps, so no byte of the file goes unaccounted for).
std::vector<const Entry*> data_order(const std::string& path, const std::vector<Entry>& entries, uint64_t data_size) {
  std::vector<const Entry*> order;
  for (const Entry& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry* e : order) {
    if (e->begin < covered) {
      fail(path, "tensor '" + e->name + "' (bytes [" + std::to_string(e->begin) + ", " + std::to_string(e->end) +
                     ")) overlaps tensor '" + previous->name + "' (bytes [" + std::to_string(previous->begin) + ", " +
                     std::to_string(previous->end) + "))");
    }
    if (e->begin > covered) {
      fail(path, "data bytes [" + std::to_string(covered) + ", " + std::to_string(e->begin) + ") before tensor '" +
                     e->name + "' belong to no tensor (the format forbids holes)");
    }
    covered = e->end;
    previous = e;
  }
  if (covered != data_size) {
    fail(path, "data bytes [" + std::to_string(covered) + ", " + std::to_string(data_size) +
                   ") after the last tensor belong to no tensor (the format forbids holes)");
  }
  return order;
}

}  // namespace

SafetensorsFile read_safetensors(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) fail(path, "cannot open: " + ec.message());
  if (size < 8) fail(path, "is " + std::to_string(size) + " bytes, too short for a header");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open for reading");
  uint64_t n = 0;
  const nlohmann::json header = read_header(path, in, size, n);
  const uint64_t data_size = size - 8 - n;
  // Every entry validated before anything is allocated.
  std::vector<Entry> entries;
  SafetensorsFile file;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      read_metadata(path, entry, file.metadata);
    } else {
      entries.push_back(read_entry(path, name, entry, data_size));
    }
  }
  // Each tensor read straight into its buffer: at most the file's size in all.
  for (const Entry* e : data_order(path, entries, data_size)) {
    SafetensorsFile::Tensor t;
    t.shape = e->shape;
    t.data.resize(static_cast<size_t>((e->end - e->begin) / sizeof(float)));
    const auto bytes = static_cast<std::streamsize>(e->end - e->begin);
    if (!t.data.empty()) in.read(reinterpret_cast<char*>(t.data.data()), bytes);
    if (!in) fail(path, "tensor '" + e->name + "': read failed (the file shrank while being read?)");
    file.tensors.emplace(e->name, std::move(t));
  }
  return file;
}

}  // namespace s3r::io
