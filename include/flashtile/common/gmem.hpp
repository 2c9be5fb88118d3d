// Global-memory views shared by the backward kernels of both paths: the rows of one
// (sequence, head) of a (batch, seqlen, heads, head_dim) tensor, or of a
// packed (total, heads, head_dim) one, whose strides are arbitrary (in
// elements) and whose last dim is contiguous. (The backward's SASS is identical with and without this helper.
// The forward keeps its own inline views: routed through it, its SASS was
// scheduled differently, and that version has not been timed.)
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>

namespace flashtile {

using namespace cute;

// (rows, kHeadDim) view of head `head` of the sequence whose row 0 is
// seq_offset elements from base (SeqInfo::q_offset / k_offset).
template <int kHeadDim, class Element>
CUTE_DEVICE auto head_rows(Element* base, int64_t seq_offset, int64_t row_stride, int64_t head_stride, int head,
                           int rows) {
  return make_tensor(make_gmem_ptr(base + seq_offset + head * head_stride), make_shape(rows, Int<kHeadDim>{}),
                     make_stride(row_stride, _1{}));
}

}  // namespace flashtile
