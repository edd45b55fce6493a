// The single-process communicator and what every communicator shares; see
// s3r/dist/communicator.hpp. The MPI one is in mpi_communicator.cpp (built with S3R_WITH_MPI).
#include "s3r/dist/communicator.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"

namespace s3r::dist {

bool Communicator::any(bool flag) {
  AlignedVector<float> v{flag ? 1.0f : 0.0f};
  max(v);
  return v[0] > 0.0f;
}

std::vector<std::string> Communicator::gather_strings(const std::string& mine) {
  constexpr size_t kLen = 256;
  std::vector<char> buf(kLen, '\0');
  std::memcpy(buf.data(), mine.data(), std::min(mine.size(), kLen - 1));
  std::vector<char> all(kLen * static_cast<size_t>(size()));
  all_gather<char>(buf, all);
  std::vector<std::string> out;
  for (int r = 0; r < size(); ++r) out.emplace_back(all.data() + r * kLen);
  return out;
}

void SingleProcess::all_gather_bytes(std::span<const std::byte> mine, std::span<std::byte> all) {
  if (all.size() != mine.size()) throw Error("all_gather: the output must hold one copy of the input per rank");
  std::memcpy(all.data(), mine.data(), mine.size());
}

// One process has no other ranks to stop: the caller's error simply propagates (no exit() in
// the library; tools/s3r_main.cpp calls stop_every_rank only when there are several ranks).
void SingleProcess::stop_every_rank(int code) {
  throw Error("stop_every_rank(" + std::to_string(code) + ") of a single process: nothing else to stop");
}

Communicator& single_process() {
  static SingleProcess one;
  return one;
}

bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

#ifndef S3R_WITH_MPI
bool built_with_mpi() { return false; }

std::unique_ptr<Communicator> world(int*, char***) {
  if (launched_by_mpirun()) {
    throw Error("this s3r was built without MPI (OpenMPI's libopenmpi-dev was not found at configure time), "
                "but was started by mpirun; install openmpi-bin and libopenmpi-dev and rebuild "
                "(scripts/setup.sh), or run without mpirun");
  }
  return std::make_unique<SingleProcess>();
}
#endif

}  // namespace s3r::dist
