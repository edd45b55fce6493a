#pragma once
// Token shards: the binary files `s3r data prepare` writes and the trainer reads. Little-endian:
//
//   offset  size  field
//        0     8  magic "S3RTOKS" + '\0'
//        8     4  version (1)
//       12     4  bytes per token: 2 (uint16) or 4 (uint32)
//       16     8  token count n
//       24     4  vocabulary size V (every token is < V)
//       28     4  reserved (0)
//       32  n*b   tokens
//
// Opening validates everything, the file size included, and names the file and the field at
// fault. The token count is checked against the file size before it sizes anything (no
// overflow of n * width, no allocation beyond the file). Writing goes to a temporary name and renames it, so no reader ever sees half a shard.
#include <cstdint>
#include <string>
#include <vector>

namespace s3r::data {

inline constexpr char kShardMagic[8] = {'S', '3', 'R', 'T', 'O', 'K', 'S', '\0'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr int64_t kShardHeaderBytes = 32;

struct TokenShard {
  uint32_t vocab = 0;
  std::vector<uint32_t> tokens;
};

// Writes tokens (each < vocab) with 2 bytes per token when vocab <= 65536, else 4.
void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, uint32_t vocab);

// Reads and validates a shard; throws s3r::Error naming the file and what is wrong.
TokenShard read_shard(const std::string& path);

}  // namespace s3r::data
