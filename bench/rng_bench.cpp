// Random-word generation rate of the batch APIs s3r::random_bits32 (Threefry-2x32-20, JAX's
// partitionable layout) and s3r::philox_bits32 (Philox-4x32-10): items/s = 32-bit words/s.
//
//   rng/GEN/ISA/words:W/threads:P
//     GEN      threefry | philox
//     ISA      avx512 (16-lane kernels) | ref (the scalar reference twin)
//     W        output words per call: 16384 (64 KiB: one chunk of the batch API, so one thread
//              whatever P is; L2-resident), 262144 (1 MiB: 16 chunks, L2-resident, the
//              multi-thread generation rate), 4194304 (16 MiB: the rate with the stores going to
//              L3/DRAM)
//     P        OpenMP threads
// The output buffer is allocated and touched once, outside the timed loop; every iteration
// overwrites it with the same words (key (0, 42), first index 0).
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "s3r/rng/philox.hpp"
#include "s3r/rng/threefry.hpp"

namespace s3r::bench {
namespace {

enum class Gen { kThreefry, kPhilox };

std::span<uint32_t> output_buffer(int64_t words) {
  static std::map<int64_t, std::vector<uint32_t>> buffers;
  auto& b = buffers[words];
  if (b.empty()) b.assign(static_cast<size_t>(words), 0u);
  return b;
}

void bm_rng(benchmark::State& state, Gen gen, Isa isa, int64_t words, int threads) {
  if (!enter(state, isa, threads)) return;
  const ScopedIsa scoped(isa);
  const std::span<uint32_t> out = output_buffer(words);
  const Key key{0u, 42u};
  const PhiloxKey pkey{0u, 42u};
  auto generate = [&] {
    if (gen == Gen::kThreefry) {
      random_bits32(key, 0, out);
    } else {
      philox_bits32(pkey, 0, out);
    }
  };
  generate();  // warm-up: OpenMP pool, caches
  for (auto _ : state) {
    generate();
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * words);
  state.SetBytesProcessed(state.iterations() * words * 4);
}

const bool registered = [] {
  const int64_t kSizes[] = {int64_t{1} << 14, int64_t{1} << 18, int64_t{1} << 22};
  for (Gen gen : {Gen::kThreefry, Gen::kPhilox}) {
    for (Isa isa : kIsas) {
      for (int64_t words : kSizes) {
        // 16K words are a single chunk of the batch API: extra threads would idle.
        const std::vector<int> threads = words == kSizes[0] ? std::vector<int>{1} : thread_counts();
        for (int t : threads) {
          const std::string name = std::string("rng/") +
                                   (gen == Gen::kThreefry ? "threefry" : "philox") + "/" +
                                   isa_label(isa) + "/words:" + std::to_string(words) +
                                   "/threads:" + std::to_string(t);
          benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
            bm_rng(s, gen, isa, words, t);
          })->UseRealTime();
        }
      }
    }
  }
  return true;
}();

}  // namespace
}  // namespace s3r::bench
