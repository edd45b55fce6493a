// MPI ranks (OpenMPI) behind s3r::dist::Communicator; compiled only with S3R_WITH_MPI.
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/dist/communicator.hpp"
#include "s3r/dist/tree_sum.hpp"

namespace s3r::dist {

namespace {

int as_count(size_t n, const char* what) {
  if (n > static_cast<size_t>(INT32_MAX)) {
    throw Error(std::string(what) + ": " + std::to_string(n) + " elements exceed MPI's int count");
  }
  return static_cast<int>(n);
}

class Mpi final : public Communicator {
 public:
  Mpi(int* argc, char*** argv) {
    int provided = 0;
    // FUNNELED: only the thread that called MPI_Init communicates (OpenMP threads never do).
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~Mpi() override { MPI_Finalize(); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void max(std::span<float> x) override {
    if (size_ == 1) return;
    MPI_Allreduce(MPI_IN_PLACE, x.data(), as_count(x.size(), "max"), MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
    bytes_sent_ += static_cast<int64_t>(x.size_bytes());
  }
  void sum(std::span<int32_t> x) override {
    if (size_ == 1) return;
    // Integer addition is associative: MPI's order does not matter.
    MPI_Allreduce(MPI_IN_PLACE, x.data(), as_count(x.size(), "sum"), MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD);
    bytes_sent_ += 2 * static_cast<int64_t>(x.size_bytes()) * (size_ - 1) / size_;  // ring all-reduce
  }
  // Reduce-scatter by hand (every rank receives the R partials of its slice and adds them in the
  // tree's order), then all-gather of the slices: a deterministic all-reduce with the volume of
  // a ring all-reduce, 2 (R-1)/R of x per rank.
  void tree_sum(std::span<float> x) override {
    if (size_ == 1) return;
    const int64_t n = static_cast<int64_t>(x.size()), R = size_;
    std::vector<int> counts(R), displs(R);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t b = n * r / R, e = n * (r + 1) / R;
      counts[r] = as_count(static_cast<size_t>(e - b), "tree_sum");
      displs[r] = as_count(static_cast<size_t>(b), "tree_sum");
    }
    const int mine = counts[rank_];
    pieces_.resize(static_cast<size_t>(mine) * R);
    std::vector<int> rcounts(R, mine), rdispls(R);
    for (int64_t r = 0; r < R; ++r) rdispls[r] = static_cast<int>(r * mine);
    MPI_Alltoallv(x.data(), counts.data(), displs.data(), MPI_FLOAT, pieces_.data(), rcounts.data(),
                  rdispls.data(), MPI_FLOAT, MPI_COMM_WORLD);
    tree_sum_pieces(pieces_.data(), R, mine);
    MPI_Allgatherv(pieces_.data(), mine, MPI_FLOAT, x.data(), counts.data(), displs.data(), MPI_FLOAT,
                   MPI_COMM_WORLD);
    bytes_sent_ += 2 * (n - mine) * static_cast<int64_t>(sizeof(float));
  }
  void all_gather_bytes(std::span<const std::byte> mine, std::span<std::byte> all) override {
    if (all.size() != mine.size() * static_cast<size_t>(size_)) {
      throw Error("all_gather: the output must hold one copy of the input per rank");
    }
    MPI_Allgather(mine.data(), as_count(mine.size(), "all_gather"), MPI_BYTE, all.data(),
                  as_count(mine.size(), "all_gather"), MPI_BYTE, MPI_COMM_WORLD);
    bytes_sent_ += static_cast<int64_t>(mine.size()) * (size_ - 1);
  }
  void all_gather_in_place_bytes(std::span<std::byte> x, std::span<const int64_t> offsets,
                                 size_t element_size) override {
    if (size_ == 1) return;
    if (offsets.size() != static_cast<size_t>(size_) + 1 ||
        static_cast<size_t>(offsets[size_]) * element_size > x.size()) {
      throw Error("all_gather_in_place: offsets must hold R + 1 values within x");
    }
    // Counts in elements (an MPI datatype of element_size bytes), so that int counts reach 2^31
    // elements rather than 2^31 bytes.
    std::vector<int> counts(size_), displs(size_);
    for (int r = 0; r < size_; ++r) {
      counts[r] = as_count(static_cast<size_t>(offsets[r + 1] - offsets[r]), "all_gather_in_place");
      displs[r] = as_count(static_cast<size_t>(offsets[r]), "all_gather_in_place");
    }
    MPI_Datatype element;
    MPI_Type_contiguous(as_count(element_size, "all_gather_in_place"), MPI_BYTE, &element);
    MPI_Type_commit(&element);
    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x.data(), counts.data(), displs.data(), element,
                   MPI_COMM_WORLD);
    MPI_Type_free(&element);
    bytes_sent_ += static_cast<int64_t>(counts[rank_]) * static_cast<int64_t>(element_size) * (size_ - 1);
  }
  void broadcast_bytes(std::span<std::byte> x, int root) override {
    if (size_ == 1) return;
    // In pieces below 2^30 bytes (MPI counts are int).
    constexpr size_t kPiece = size_t{1} << 30;
    for (size_t off = 0; off < x.size(); off += kPiece) {
      const size_t len = std::min(kPiece, x.size() - off);
      MPI_Bcast(x.data() + off, static_cast<int>(len), MPI_BYTE, root, MPI_COMM_WORLD);
    }
    if (rank_ == root) bytes_sent_ += static_cast<int64_t>(x.size());
  }
  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  // MPI_Abort is the only way to stop ranks blocked in a collective; called from main only.
  [[noreturn]] void stop_every_rank(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  int rank_ = 0, size_ = 1;
  AlignedVector<float> pieces_;
};

}  // namespace

bool built_with_mpi() { return true; }

std::unique_ptr<Communicator> world(int* argc, char*** argv) {
  if (!launched_by_mpirun()) return std::make_unique<SingleProcess>();
  return std::make_unique<Mpi>(argc, argv);
}

}  // namespace s3r::dist
