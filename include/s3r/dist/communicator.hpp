#pragma once
// The ranks of a data-parallel run (SPEC section 6) and the few collective operations s3r needs,
// behind one interface: a single process (no MPI, the default), or MPI ranks started by mpirun.
//
// Every operation is collective: every rank of the communicator calls it, in the same order,
// with the same sizes. Results are bit-identical on every rank. Nothing here depends on the
// number of threads; float sums are never left to MPI (whose reduction order is unspecified):
// tree_sum fixes the order, so that a sum over R ranks equals the one a single process forms.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace s3r::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // x[i] = max over ranks of x[i]. Exact (max does not round). NaN must not occur: callers
  // encode "not finite" as +Inf.
  virtual void max(std::span<float> x) = 0;
  // x[i] = sum over ranks of x[i] in int32 (exact; callers keep every |sum| below 2^31).
  virtual void sum(std::span<int32_t> x) = 0;
  // x = the tree sum (tree_sum.hpp: node [lo, hi) = [lo, mid) + [mid, hi), mid = lo + (hi-lo)/2)
  // over ranks 0..R-1 of every rank's x. With ranks owning contiguous, equal ranges of a leaf
  // tree, this is the top of that tree: the result does not depend on R.
  virtual void tree_sum(std::span<float> x) = 0;
  // all[r * mine.size() .. ] = rank r's `mine`; every rank passes the same size.
  virtual void all_gather_bytes(std::span<const std::byte> mine, std::span<std::byte> all) = 0;
  // In place: rank r's part, elements [offsets[r], offsets[r+1]) of x, reaches every rank
  // (elements of `element_size` bytes; offsets: R + 1 ascending values, the same on every rank,
  // offsets[R] * element_size <= x.size()).
  virtual void all_gather_in_place_bytes(std::span<std::byte> x, std::span<const int64_t> offsets,
                                         size_t element_size) = 0;
  // x = root's x on every rank.
  virtual void broadcast_bytes(std::span<std::byte> x, int root) = 0;
  virtual void barrier() = 0;
  // Ends every rank of the run with `code` (MPI_Abort; only tools/s3r_main.cpp calls it); a
  // single process has no other rank to stop and throws s3r::Error.
  [[noreturn]] virtual void stop_every_rank(int code) = 0;

  // Payload bytes this rank sent to other ranks so far (benchmarks: bytes per step).
  int64_t bytes_sent() const { return bytes_sent_; }

  template <typename T>
  void all_gather(std::span<const T> mine, std::span<T> all) {
    all_gather_bytes(std::as_bytes(mine), std::as_writable_bytes(all));
  }
  template <typename T>
  void all_gather_in_place(std::span<T> x, std::span<const int64_t> offsets) {
    all_gather_in_place_bytes(std::as_writable_bytes(x), offsets, sizeof(T));
  }
  template <typename T>
  void broadcast(std::span<T> x, int root) {
    broadcast_bytes(std::as_writable_bytes(x), root);
  }
  // Logical or over ranks.
  bool any(bool flag);
  // Every rank's string (each at most 255 bytes are kept), in rank order.
  std::vector<std::string> gather_strings(const std::string& mine);

 protected:
  int64_t bytes_sent_ = 0;
};

// One process, no communication: every collective is the identity.
class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void max(std::span<float>) override {}
  void sum(std::span<int32_t>) override {}
  void tree_sum(std::span<float>) override {}
  void all_gather_bytes(std::span<const std::byte> mine, std::span<std::byte> all) override;
  void all_gather_in_place_bytes(std::span<std::byte>, std::span<const int64_t>, size_t) override {}
  void broadcast_bytes(std::span<std::byte>, int) override {}
  void barrier() override {}
  [[noreturn]] void stop_every_rank(int code) override;
};

// The process-wide single-process communicator (the default of every layer and model).
Communicator& single_process();

// True when this process was started by mpirun (OpenMPI's or PMI's environment variables).
bool launched_by_mpirun();
// Whether this build has MPI (S3R_WITH_MPI, OpenMPI found at configure time).
bool built_with_mpi();

// The run's ranks: MPI_COMM_WORLD when launched_by_mpirun() (MPI initialised here, finalised
// when the object is destroyed), else a SingleProcess. Throws s3r::Error when mpirun started
// a build without MPI.
std::unique_ptr<Communicator> world(int* argc, char*** argv);

}  // namespace s3r::dist
