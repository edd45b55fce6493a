// The fixed summation tree of data-parallel training; see s3r/dist/tree_sum.hpp.
#include "s3r/dist/tree_sum.hpp"

#include <algorithm>

#include "core/parallel_blocks.hpp"
#include "s3r/core/aligned_vector.hpp"
#include "s3r/core/error.hpp"
#include "s3r/core/work.hpp"

namespace s3r::dist {

void add_into(std::span<float> a, std::span<const float> b) {
  if (a.size() != b.size()) throw Error("add_into: sizes differ");
  const int64_t n = static_cast<int64_t>(a.size());
  work::add_floats(3 * a.size());
  constexpr int64_t kBlock = 1 << 14;  // each element's sum is one addition: blocking is free
  parallel_blocks(n, kBlock, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) a[i] += b[i];
  });
}

namespace {

void node(std::span<float> out, int64_t lo, int64_t hi, size_t depth, const LeafFill& fill,
          std::vector<AlignedVector<float>>& scratch) {
  if (hi - lo == 1) {
    fill(lo, out);
    return;
  }
  const int64_t mid = lo + (hi - lo) / 2;
  node(out, lo, mid, depth + 1, fill, scratch);
  AlignedVector<float>& right = scratch[depth];
  right.resize(out.size());
  node(right, mid, hi, depth + 1, fill, scratch);
  add_into(out, right);
}

void piece_node(float* pieces, int64_t lo, int64_t hi, int64_t len, bool threaded) {
  if (hi - lo == 1) return;
  const int64_t mid = lo + (hi - lo) / 2;
  piece_node(pieces, lo, mid, len, threaded);
  piece_node(pieces, mid, hi, len, threaded);
  float* a = pieces + lo * len;
  const float* b = pieces + mid * len;
  if (threaded) {
    add_into({a, static_cast<size_t>(len)}, {b, static_cast<size_t>(len)});
  } else {
    for (int64_t i = 0; i < len; ++i) a[i] += b[i];
  }
}

}  // namespace

void tree_sum_leaves(std::span<float> out, int64_t leaves, const LeafFill& fill,
                     std::vector<AlignedVector<float>>& scratch) {
  if (leaves < 1) throw Error("tree_sum_leaves: needs at least one leaf, got " + std::to_string(leaves));
  // One scratch per level, all made before the descent: node() holds a reference into scratch
  // while it recurses, which growing it there would invalidate (leaf counts not a power of two).
  size_t depth = 1;
  for (int64_t span = leaves; span > 1; span = (span + 1) / 2) ++depth;
  if (scratch.size() < depth) scratch.resize(depth);
  node(out, 0, leaves, 0, fill, scratch);
}

void tree_sum_pieces(float* pieces, int64_t count, int64_t len, bool threaded) {
  if (count >= 1) piece_node(pieces, 0, count, len, threaded);
}

int64_t default_leaves(int64_t examples) {
  int64_t u = 8;
  while (u > 1 && examples % u != 0) u /= 2;
  return u;
}

bool is_tree_node(int64_t n, int64_t lo, int64_t hi) {
  int64_t a = 0, b = n;
  while (true) {
    if (a == lo && b == hi) return true;
    if (b - a <= 1 || lo < a || hi > b) return false;
    const int64_t mid = a + (b - a) / 2;
    if (hi <= mid) {
      b = mid;
    } else if (lo >= mid) {
      a = mid;
    } else {
      return false;
    }
  }
}

}  // namespace s3r::dist
