// Checks of tensor layouts shared by the host APIs (flashtile.hpp,
// kvcache.hpp): alignment for the kernels' 16-byte vectors, stride signs,
// outputs whose elements are distinct.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>

namespace flashtile {

// A 16-byte-aligned pointer whose strides (in 2-byte elements) keep every
// row 16-byte aligned: what cp.async and the vector stores need.
inline bool vector_aligned(const void* ptr, std::initializer_list<int64_t> strides) {
  if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return false;
  for (int64_t s : strides) {
    if (s % 8 != 0) return false;  // 16 bytes of 2-byte elements
  }
  return true;
}

// Strides are element counts and never negative.
inline bool strides_non_negative(std::initializer_list<int64_t> strides) {
  for (int64_t s : strides) {
    if (s < 0) return false;
  }
  return true;
}

// An output (batch, rows, heads, head_dim) with a contiguous last dim whose
// elements are all distinct: sorted by stride, each dim of more than one
// element steps past everything the smaller ones span. Two CTAs writing the
// same address would race. (Sufficient, not exact: a few interleaved layouts
// that do not overlap are refused too.)
inline bool non_overlapping(int64_t batch, int64_t rows, int64_t heads, int64_t head_dim,
                            int64_t batch_stride, int64_t row_stride, int64_t head_stride) {
  struct Dim { int64_t size, stride; };
  Dim dims[3] = {{batch, batch_stride}, {rows, row_stride}, {heads, head_stride}};
  std::sort(dims, dims + 3, [](Dim a, Dim b) { return a.stride < b.stride; });
  int64_t span = head_dim;  // elements covered by the dims sorted so far
  for (const Dim& d : dims) {
    if (d.size <= 1) continue;
    if (d.stride < span || d.stride > std::numeric_limits<int64_t>::max() / d.size) return false;
    span = d.stride * d.size;
  }
  return true;
}

}  // namespace flashtile
