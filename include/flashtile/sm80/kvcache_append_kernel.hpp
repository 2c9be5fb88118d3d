// The KV cache's append (KvAppendParams, kvcache_params.hpp): the new keys
// and values written into the cache, the keys and the queries rotated, in
// one kernel ahead of the attention. A warp per row of head_dim features:
// the query rows first (when rotated), then one per new (sequence, row, KV
// head), which writes both its key and its value. Plain loads and stores,
// any strides: a decode step appends a few KB, where a launch, not the
// bytes, is the cost (the torch ops it replaces were about 25 launches with
// rotary).
#pragma once

#include <cuda_runtime_api.h>
#include <cutlass/numeric_types.h>

#include <cstdint>

#include "flashtile/kvcache_params.hpp"
#include "flashtile/status.hpp"

namespace flashtile::sm80 {

inline constexpr int kAppendRowsPerBlock = 4;  // a warp each

// dst[j] = src[j] for every feature j, the first rotary_dim of them rotated
// by the angles cos_row / sin_row (nullptr: no rotation), in fp32.
template <class Element, class Angle>
__device__ __forceinline__ void rotate_row(const Element* src, int64_t src_stride, Element* dst,
                                           int64_t dst_stride, const Angle* cos_row, const Angle* sin_row,
                                           KvAppendParams const& p, int lane) {
  const int half = p.rotary_dim / 2;
  for (int j = lane; j < p.head_dim; j += 32) {
    float value = float(src[j * src_stride]);
    if (cos_row != nullptr && j < p.rotary_dim) {
      // The pair's other feature, the angle's index, and the sign of the
      // sine term: (x, y) -> (x cos - y sin, y cos + x sin).
      const bool second = p.rotary_interleaved ? (j & 1) : j >= half;
      const int angle = p.rotary_interleaved ? j / 2 : (second ? j - half : j);
      const int partner = p.rotary_interleaved ? (j ^ 1) : (second ? j - half : j + half);
      const float c = float(cos_row[angle * p.rotary_col_stride]);
      const float s = float(sin_row[angle * p.rotary_col_stride]);
      const float other = float(src[partner * src_stride]);
      // Each product rounded, then the sum (no FMA contraction): the bits
      // of flashtile.rotary.apply_rotary_emb's fp32 tensor ops.
      const float own_term = __fmul_rn(value, c), other_term = __fmul_rn(other, s);
      value = second ? __fadd_rn(own_term, other_term) : __fsub_rn(own_term, other_term);
    }
    dst[j * dst_stride] = Element(value);
  }
}

template <class Element, class Angle>
__global__ void kvcache_append_kernel(const __grid_constant__ KvAppendParams p) {
  const int lane = int(threadIdx.x) % 32;
  const int64_t row = int64_t(blockIdx.x) * kAppendRowsPerBlock + int(threadIdx.x) / 32;
  const int64_t q_rows = p.q_out != nullptr ? int64_t(p.batch) * p.seqlen_q * p.nheads : 0;
  const int64_t kv_rows = p.k != nullptr ? int64_t(p.batch) * p.seqlen_new * p.nheads_k : 0;
  const auto* cos = static_cast<const Angle*>(p.rotary_cos);
  const auto* sin = static_cast<const Angle*>(p.rotary_sin);
  // The angles of a position: nullptr (no rotation) without tables or
  // outside them.
  auto angles = [&](int position, const Angle* table) -> const Angle* {
    if (table == nullptr || position < 0 || position >= p.seqlen_ro) return nullptr;
    return table + position * p.rotary_row_stride;
  };
  if (row < q_rows) {
    const int head = int(row % p.nheads);
    const int64_t token = row / p.nheads;
    const int i = int(token % p.seqlen_q);
    const int b = int(token / p.seqlen_q);
    const int position = p.cache_seqlens[b] + (p.q_rows_share_position ? 0 : i);
    const auto* src = static_cast<const Element*>(p.q) + b * p.q_batch_stride + i * p.q_row_stride +
                      head * p.q_head_stride;
    auto* dst = static_cast<Element*>(p.q_out) + b * p.q_out_batch_stride + i * p.q_out_row_stride +
                head * p.q_out_head_stride;
    rotate_row(src, p.q_dim_stride, dst, 1, angles(position, cos), angles(position, sin), p, lane);
    return;
  }
  if (row >= q_rows + kv_rows) return;
  const int64_t kv_row = row - q_rows;
  const int head = int(kv_row % p.nheads_k);
  const int64_t token = kv_row / p.nheads_k;
  const int i = int(token % p.seqlen_new);
  const int b = int(token / p.seqlen_new);
  const int seqlen = p.cache_seqlens[b];
  if (p.cache_seqlens_out != nullptr && i == 0 && head == 0 && lane == 0) {
    p.cache_seqlens_out[b] = seqlen + p.seqlen_new;
  }
  const int position = seqlen + i;
  if (position < 0 || position >= p.seqlen_k) return;  // past what the entry holds
  int64_t entry;
  int cache_row;
  if (p.block_table != nullptr) {
    entry = p.block_table[b * p.block_table_batch_stride + position / p.page_size];
    cache_row = position % p.page_size;
  } else {
    entry = p.cache_batch_idx != nullptr ? p.cache_batch_idx[b] : b;
    cache_row = position;
  }
  const auto* k = static_cast<const Element*>(p.k) + b * p.k_batch_stride + i * p.k_row_stride +
                  head * p.k_head_stride;
  const auto* v = static_cast<const Element*>(p.v) + b * p.v_batch_stride + i * p.v_row_stride +
                  head * p.v_head_stride;
  auto* k_cache = static_cast<Element*>(p.k_cache) + entry * p.k_page_stride + cache_row * p.k_cache_row_stride +
                  head * p.k_cache_head_stride;
  auto* v_cache = static_cast<Element*>(p.v_cache) + entry * p.v_page_stride + cache_row * p.v_cache_row_stride +
                  head * p.v_cache_head_stride;
  rotate_row(k, p.k_dim_stride, k_cache, p.k_cache_dim_stride, angles(position, cos), angles(position, sin), p,
             lane);
  rotate_row<Element, Angle>(v, p.v_dim_stride, v_cache, p.v_cache_dim_stride, nullptr, nullptr, p, lane);
}

// Entry point a generated kernels/kvcache_append_*.cu file instantiates and
// registers. Assumes can_implement_kvcache_append(params) passed.
template <class Element>
Status run_kvcache_append(const KvAppendParams& p, cudaStream_t stream) {
  const int64_t q_rows = p.q_out != nullptr ? int64_t(p.batch) * p.seqlen_q * p.nheads : 0;
  const int64_t kv_rows = p.k != nullptr ? int64_t(p.batch) * p.seqlen_new * p.nheads_k : 0;
  const int64_t blocks = (q_rows + kv_rows + kAppendRowsPerBlock - 1) / kAppendRowsPerBlock;
  if (blocks == 0) return Status::kSuccess;
  auto* kernel = p.rotary_fp32 ? &kvcache_append_kernel<Element, float> : &kvcache_append_kernel<Element, Element>;
  kernel<<<unsigned(blocks), 32 * kAppendRowsPerBlock, 0, stream>>>(p);
  return cudaPeekAtLastError() == cudaSuccess ? Status::kSuccess : Status::kCudaError;
}

}  // namespace flashtile::sm80
