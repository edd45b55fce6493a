#pragma once
// Scratch buffers that a function keeps between calls (usually thread_local) and that calls of
// different sizes share.
#include <cstddef>
#include <cstdint>

namespace s3r {

// The first n elements of v, grown when it is shorter and never shrunk. std::vector::resize
// value-initializes every element it adds, so a buffer resized down for a small call and back up
// for a large one would zero-fill the difference on every such call (at `small`, megabytes per
// product between the forward and the dW shapes). The callers overwrite what they read.
template <class Vector>
auto* scratch(Vector& v, int64_t n) {
  if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
  return v.data();
}

}  // namespace s3r
