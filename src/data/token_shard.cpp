#include "s3r/data/token_shard.hpp"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "s3r/core/error.hpp"
#include "s3r/io/atomic_file.hpp"

namespace s3r::data {

namespace {

template <typename T>
void put(std::string& buf, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // the machines we build for are little-endian
  buf.append(bytes, sizeof(T));
}

template <typename T>
T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error("token shard '" + path + "': " + what);
}

}  // namespace

void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, uint32_t vocab) {
  if (vocab == 0) fail(path, "vocabulary size must be >= 1");
  const uint32_t width = vocab <= 65536 ? 2 : 4;
  std::string buf;
  buf.reserve(static_cast<size_t>(kShardHeaderBytes) + tokens.size() * width);
  buf.append(kShardMagic, 8);
  put<uint32_t>(buf, kShardVersion);
  put<uint32_t>(buf, width);
  put<uint64_t>(buf, tokens.size());
  put<uint32_t>(buf, vocab);
  put<uint32_t>(buf, 0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab) {
      fail(path, "token " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                     " is not below the vocabulary size " + std::to_string(vocab));
    }
    if (width == 2) {
      put<uint16_t>(buf, static_cast<uint16_t>(tokens[i]));
    } else {
      put<uint32_t>(buf, tokens[i]);
    }
  }
  io::write_file_atomic(path, [&](std::ostream& out) {
    out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
  });
}

TokenShard read_shard(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) fail(path, "cannot open: " + ec.message());
  if (size < static_cast<uintmax_t>(kShardHeaderBytes)) {
    fail(path, "is " + std::to_string(size) + " bytes, shorter than the 32-byte header (truncated?)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open for reading");
  char header[kShardHeaderBytes];
  in.read(header, kShardHeaderBytes);
  if (!in) fail(path, "cannot read the 32-byte header");
  if (std::memcmp(header, kShardMagic, 8) != 0) fail(path, "bad magic: not an s3r token shard");
  const auto version = get<uint32_t>(header + 8);
  if (version != kShardVersion) {
    fail(path, "version " + std::to_string(version) + ", this build reads version " +
                   std::to_string(kShardVersion));
  }
  const auto width = get<uint32_t>(header + 12);
  if (width != 2 && width != 4) fail(path, "bytes per token is " + std::to_string(width) + ", expected 2 or 4");
  const auto count = get<uint64_t>(header + 16);
  const auto vocab = get<uint32_t>(header + 24);
  // The count comes from the file: compare it with what the file can hold before multiplying, so
  // that a corrupt count (a flipped high bit) can neither overflow count * width nor size an
  // allocation past the file.
  const uintmax_t payload = size - static_cast<uintmax_t>(kShardHeaderBytes);
  if (count > payload / width || count * width != payload) {
    std::ostringstream msg;
    msg << "file size is " << size << " bytes, but the header promises " << count << " tokens of "
        << width << " bytes";
    if (count <= (std::numeric_limits<uint64_t>::max() - kShardHeaderBytes) / width) {
      msg << " = " << static_cast<uint64_t>(kShardHeaderBytes) + count * width << " bytes";
    } else {
      msg << ", more than any file holds";
    }
    msg << " (truncated or corrupt)";
    fail(path, msg.str());
  }
  if (vocab == 0) fail(path, "vocabulary size is 0");
  TokenShard shard;
  shard.vocab = vocab;
  shard.tokens.resize(static_cast<size_t>(count));
  std::vector<char> raw(static_cast<size_t>(payload));
  in.read(raw.data(), static_cast<std::streamsize>(raw.size()));
  if (!in) fail(path, "read failed (the file shrank while being read?)");
  for (uint64_t i = 0; i < count; ++i) {
    const uint32_t t = width == 2 ? get<uint16_t>(raw.data() + 2 * i) : get<uint32_t>(raw.data() + 4 * i);
    if (t >= vocab) {
      fail(path, "token " + std::to_string(t) + " at index " + std::to_string(i) +
                     " is not below the vocabulary size " + std::to_string(vocab));
    }
    shard.tokens[i] = t;
  }
  return shard;
}

}  // namespace s3r::data
