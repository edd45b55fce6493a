// libFuzzer target: bytes -> a token shard file -> data::read_shard (include/s3r/data/token_shard.hpp).
// A shard that reads must keep its promises: every token below the vocabulary.
#include <cstdint>
#include <cstdlib>

#include "fuzz_util.hpp"
#include "s3r/core/error.hpp"
#include "s3r/data/token_shard.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = s3r::fuzz::scratch() / "shard.bin";
  s3r::fuzz::write_file(path, s3r::fuzz::as_view(data, size));
  try {
    const s3r::data::TokenShard shard = s3r::data::read_shard(path.string());
    if (shard.vocab == 0) std::abort();
    for (uint32_t t : shard.tokens) {
      if (t >= shard.vocab) std::abort();
    }
  } catch (const s3r::Error&) {
  }
  return 0;
}
