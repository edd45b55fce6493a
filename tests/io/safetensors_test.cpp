// safetensors: round trip, byte layout, and clear errors on corrupt files.
#include "s3r/io/safetensors.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "temp_dir.hpp"

namespace s3r::io {
namespace {

std::string temp_path(const std::string& name) {
  return (testing::process_temp_dir("s3r_io_test") / name).string();
}

TEST(Safetensors, RoundTripWithMetadata) {
  const AlignedVector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 5.0f, 6.0f};
  const AlignedVector<float> b = {7.0f};
  const std::string path = temp_path("rt.safetensors");
  write_safetensors(path, {{"a", {2, 3}, a}, {"b", {1}, b}}, {{"step", "12"}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  const SafetensorsFile f = read_safetensors(path);
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors.at("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.tensors.at("a").data, a);
  EXPECT_EQ(f.tensors.at("b").data, b);
  EXPECT_EQ(f.metadata.at("step"), "12");
  // Layout: 8-byte header length, JSON header, then the tensors' bytes in order.
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(std::filesystem::file_size(path), 8 + n + 7 * sizeof(float));
}

TEST(Safetensors, CorruptFilesAreRejected) {
  const AlignedVector<float> a(100, 1.0f);
  const std::string path = temp_path("bad.safetensors");
  write_safetensors(path, {{"w", {10, 10}, a}});
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  try {
    read_safetensors(path);
    FAIL() << "expected an error for a truncated file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_safetensors(temp_path("missing.safetensors")), Error);
  EXPECT_THROW(write_safetensors(path, {{"w", {3, 3}, a}}), Error);  // shape != data size
}

// A safetensors file written by hand: the header text as given, then `data_bytes` bytes.
std::string write_raw(const std::string& name, const std::string& header, size_t data_bytes) {
  const std::string path = temp_path(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  const std::vector<char> data(data_bytes, 0);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  return path;
}

// The s3r::Error message reading the file gives, or "(no error)". Any other exception escapes
// and fails the test: that is the bug these tests guard against (a nlohmann exception or
// std::length_error reaching the tool as an internal error).
std::string error_of(const std::string& header, size_t data_bytes) {
  const std::string path = write_raw("fault.safetensors", header, data_bytes);
  try {
    read_safetensors(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Each message names the file, the tensor (or field) and what is wrong.
void expect_error(const std::string& header, size_t data_bytes, const std::vector<std::string>& parts) {
  const std::string error = error_of(header, data_bytes);
  EXPECT_NE(error.find("fault.safetensors"), std::string::npos) << header << " -> " << error;
  for (const std::string& part : parts) {
    EXPECT_NE(error.find(part), std::string::npos) << header << " -> " << error << "\n  (expected '" << part << "')";
  }
}

TEST(SafetensorsFaults, HandWrittenValidFileReads) {
  // Sanity for the helpers: a well-formed header, a zero-size tensor, space padding.
  const std::string path = write_raw(
      "valid.safetensors",
      R"({"e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]},)"
      R"( "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "__metadata__": {"k": "v"}}    )",
      8);
  const SafetensorsFile f = read_safetensors(path);
  EXPECT_EQ(f.tensors.at("w").data.size(), 2u);
  EXPECT_TRUE(f.tensors.at("e").data.empty());
  EXPECT_EQ(f.tensors.at("e").shape, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(f.metadata.at("k"), "v");
}

TEST(SafetensorsFaults, HeaderNotAJsonObject) {
  expect_error("{", 0, {"header is not valid JSON"});
  expect_error("[1, 2]", 0, {"header is a JSON array, expected an object"});
  expect_error("\"w\"", 0, {"header is a JSON string, expected an object"});
}

TEST(SafetensorsFaults, TensorEntryNotAnObject) {
  expect_error(R"({"w": 5})", 0, {"tensor 'w' is a JSON number, expected an object"});
  expect_error(R"({"w": ["F32", [1], [0, 4]]})", 4, {"tensor 'w' is a JSON array"});
}

TEST(SafetensorsFaults, DtypeMissingMistypedOrNotF32) {
  expect_error(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4, {"tensor 'w'", "no \"dtype\""});
  expect_error(R"({"w": {"dtype": 32, "shape": [1], "data_offsets": [0, 4]}})", 4,
               {"tensor 'w'", "\"dtype\" is a JSON number"});
  expect_error(R"({"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}})", 4,
               {"tensor 'w'", "dtype \"F16\"", "only F32"});
}

TEST(SafetensorsFaults, ShapeNotAnArrayOfNonNegativeIntegers) {
  expect_error(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", 4, {"tensor 'w'", "no \"shape\""});
  expect_error(R"({"w": {"dtype": "F32", "shape": "x", "data_offsets": [0, 4]}})", 4,
               {"tensor 'w'", "\"shape\" is a JSON string"});
  expect_error(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4,
               {"tensor 'w'", "\"shape\"[0] is -1"});
  // 1.5 would silently convert to 1 (and then match the offsets).
  expect_error(R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4,
               {"tensor 'w'", "\"shape\"[0] is 1.5"});
  expect_error(R"({"w": {"dtype": "F32", "shape": [1, "2"], "data_offsets": [0, 8]}})", 8,
               {"tensor 'w'", "\"shape\"[1] is \"2\""});
  expect_error(R"({"w": {"dtype": "F32", "shape": [[1]], "data_offsets": [0, 4]}})", 4,
               {"tensor 'w'", "\"shape\"[0] is [1]"});
}

TEST(SafetensorsFaults, ShapeWhoseProductOverflows) {
  // (2^62 + 1) * 4 bytes wraps to 4 in uint64: the offsets [0, 4] matched and the reader then
  // tried to allocate 2^62 floats.
  expect_error(R"({"w": {"dtype": "F32", "shape": [4611686018427387905], "data_offsets": [0, 4]}})", 4,
               {"tensor 'w'", "more than 2^61 values"});
  // 2^32 * 2^32 overflows int64 (undefined behaviour in a plain product).
  expect_error(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 1], "data_offsets": [0, 4]}})", 4,
               {"tensor 'w'", "more than 2^61 values"});
  // Beyond int64 itself, and hidden behind a zero dimension.
  expect_error(R"({"w": {"dtype": "F32", "shape": [0, 18446744073709551615], "data_offsets": [0, 0]}})", 0,
               {"tensor 'w'", "more than 2^61 values"});
}

TEST(SafetensorsFaults, DataOffsetsNotTwoNonNegativeIntegers) {
  expect_error(R"({"w": {"dtype": "F32", "shape": [1]}})", 4, {"tensor 'w'", "no \"data_offsets\""});
  const std::string prefix = R"({"w": {"dtype": "F32", "shape": [1], )";
  for (const char* bad : {"[0]", "[0, 4, 8]", "\"0-4\"", "[\"0\", \"4\"]", "[-4, 0]", "[0, 4.0]", "{}"}) {
    expect_error(prefix + R"("data_offsets": )" + bad + "}}", 4,
                 {"tensor 'w'", "\"data_offsets\" is", "expected [begin, end]"});
  }
  expect_error(prefix + R"("data_offsets": [4, 0]}})", 4, {"tensor 'w'", "data offsets [4, 0]: the end is before the begin"});
  expect_error(prefix + R"("data_offsets": [0, 8]}})", 4, {"tensor 'w'", "outside the file's 4 data bytes"});
  expect_error(prefix + R"("data_offsets": [0, 8]}})", 8, {"tensor 'w'", "(8 bytes), but its shape [1] of F32 needs 4 bytes"});
}

TEST(SafetensorsFaults, MetadataNotAnObjectOfStrings) {
  expect_error(R"({"__metadata__": {"step": 12}})", 0, {"\"__metadata__\" field 'step' is a JSON number"});
  expect_error(R"({"__metadata__": ["a"]})", 0, {"\"__metadata__\" is a JSON array"});
  expect_error(R"({"__metadata__": "a"})", 0, {"\"__metadata__\" is a JSON string"});
}

TEST(SafetensorsFaults, HeaderLengthAbsurd) {
  // Longer than the file.
  {
    const std::string path = temp_path("long_header.safetensors");
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const uint64_t n = uint64_t{1} << 63;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
    out.close();
    EXPECT_THROW(read_safetensors(path), Error);
  }
  // Within the file but past the format's 100 MB limit: refused before allocating it. The file
  // is sparse (no disk space used).
  const std::string path = temp_path("huge_header.safetensors");
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const uint64_t n = 200'000'000;
    out.write(reinterpret_cast<const char*>(&n), 8);
  }
  std::filesystem::resize_file(path, 8 + 200'000'000);
  try {
    read_safetensors(path);
    FAIL() << "expected an error for a 200 MB header";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("limit of 100000000 bytes"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
  // Shorter than the length field.
  expect_error("", 0, {"header is not valid JSON"});
  const std::string tiny = temp_path("tiny.safetensors");
  std::ofstream(tiny, std::ios::binary | std::ios::trunc) << "abc";
  EXPECT_THROW(read_safetensors(tiny), Error);
}

TEST(SafetensorsFaults, OverlappingTensorsAreRejected) {
  // Both tensors alias bytes [0, 4): the old reader accepted this silently.
  expect_error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
               R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
               4, {"tensor 'b'", "overlaps tensor 'a'"});
  expect_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
               R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
               12, {"tensor 'b'", "overlaps tensor 'a'"});
}

TEST(SafetensorsFaults, HolesAndTrailingBytesAreRejected) {
  expect_error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
               R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
               12, {"data bytes [4, 8) before tensor 'b'", "holes"});
  expect_error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8,
               {"data bytes [0, 4) before tensor 'a'"});
  expect_error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8,
               {"data bytes [4, 8) after the last tensor"});
  expect_error(R"({})", 4, {"data bytes [0, 4) after the last tensor"});
}

}  // namespace
}  // namespace s3r::io
