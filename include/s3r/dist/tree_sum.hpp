#pragma once
// The fixed summation tree of data-parallel training (SPEC section 6).
//
// A step's global batch is cut into U "reduction leaves" of equal, contiguous ranges of examples.
// Every float gradient that is a sum over tokens (the LM head's and the float modes' weight
// gradients, the embedding, the RMSNorm gains) is formed per leaf and the leaf partials are
// added in one tree: node [lo, hi) = node [lo, mid) + node [mid, hi), mid = lo + (hi - lo) / 2.
// A rank that owns leaves [r U/R, (r+1) U/R) (R a power of two dividing U) owns a whole subtree,
// so summing its subtree locally and the R subtree roots with Communicator::tree_sum gives the
// bits a single process gets: the sum does not depend on the number of ranks (or threads).
#include <cstdint>
#include <functional>
#include <span>
#include <vector>
#include "s3r/core/aligned_vector.hpp"

namespace s3r::dist {

// Fills `out` (overwriting every element) with the partial of leaf `leaf`.
using LeafFill = std::function<void(int64_t leaf, std::span<float> out)>;

// out = tree sum of the partials of leaves [0, leaves); `scratch` holds one buffer of out's size
// per tree level below the root (reused across calls). leaves >= 1.
void tree_sum_leaves(std::span<float> out, int64_t leaves, const LeafFill& fill,
                     std::vector<AlignedVector<float>>& scratch);

// a[i] += b[i], threaded over fixed blocks (bit-identical for any thread count).
void add_into(std::span<float> a, std::span<const float> b);

// Sums pieces[0..count) (each `len` floats, contiguous) in the tree above, in place: the result
// is left in piece 0. threaded: each addition of two pieces over OpenMP blocks (for long pieces);
// otherwise on the calling thread (e.g. inside a parallel loop). The same bits either way.
void tree_sum_pieces(float* pieces, int64_t count, int64_t len, bool threaded = true);

// The reduction leaves of a step of `examples` examples: the largest power of two <= 8 that
// divides it (so up to 8 ranks, and the tree's extra additions stay a few per parameter).
int64_t default_leaves(int64_t examples);

// True when [lo, hi) is a node of the tree over [0, n) (a rank's range or a micro-batch must be).
bool is_tree_node(int64_t n, int64_t lo, int64_t hi);

}  // namespace s3r::dist
