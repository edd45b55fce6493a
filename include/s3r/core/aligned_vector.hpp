#pragma once
// s3r::AlignedVector: std::vector storage on 64-byte boundaries. AMX's tile loads (and wide vector
// loads) of a 64-byte row that straddles two cache lines cost two line reads: an AMX block on
// panels 16 bytes off a line ran at 0.4x its speed on aligned ones (Emerald Rapids class VM).
#include <cstddef>
#include <new>
#include <vector>

namespace s3r {

template <class T>
struct AlignedAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor)
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const noexcept { return true; }
};

template <class T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace s3r
