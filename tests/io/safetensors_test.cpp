// safetensors: round trip, byte layout, and clear errors on corrupt files.
#include "s3r/io/safetensors.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "s3r/core/error.hpp"

namespace s3r::io {
namespace {

std::string temp_path(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / "s3r_io_test";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

TEST(Safetensors, RoundTripWithMetadata) {
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 5.0f, 6.0f};
  const std::vector<float> b = {7.0f};
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
  const std::vector<float> a(100, 1.0f);
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

}  // namespace
}  // namespace s3r::io
