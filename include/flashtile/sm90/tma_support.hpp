// Which forwards and backwards the SM90 TMA kernels take: every forward
// (its scoremod variant applies softcap, ALiBi and dropout and writes the
// testing-only probabilities), the backward without dropout (its scoremod
// variant applies softcap and ALiBi; dropout runs the SM80 kernels), on
// tensors that TMA can describe. A
// TMA descriptor needs every stride it steps to be a positive multiple of 16
// bytes below 2^40 bytes; a mode of extent 1 is never stepped, so its stride does not matter (to_params gives
// it a harmless one). The forward also takes stride 0 along heads or batch
// (a tensor expanded along them): it describes that mode with extent 1
// (tma_extent) and reads its index 0 there (FwdMainloop::sequence_rows);
// it first folds K and V expanded over their heads into one KV head
// (flashtile.hpp's with_broadcast_kv_as_one_head). Stride 0 along rows,
// larger strides, and in the backward any stride 0 run kernels without
// TMA: the SM80 forward and backward.
#pragma once

#include <cstdint>

#include "flashtile/params.hpp"

namespace flashtile::sm90 {

inline bool tma_stride_ok(int64_t stride_elements, int64_t extent) {
  constexpr int64_t kMaxElements = (int64_t(1) << 40) / 2;  // 2-byte elements
  return extent <= 1 || (stride_elements > 0 && stride_elements % 8 == 0 && stride_elements < kMaxElements);
}

// The stride a descriptor is given for a mode of `extent`: the tensor's
// own, or for a mode of extent 1, which TMA never steps, a harmless 8
// elements whatever the caller's (TMA refuses some, 0 among them).
inline int64_t tma_stride(int64_t stride_elements, int64_t extent) { return extent > 1 ? stride_elements : 8; }

// The extent a descriptor is given for a heads or batch mode: 1 where the
// tensor is expanded along it (stride 0), its own otherwise.
inline int64_t tma_extent(int64_t stride_elements, int64_t extent) { return stride_elements == 0 ? 1 : extent; }

// TMA can step a (rows, head dim, heads, batch) tensor with these strides;
// with kExpandedOk, heads and batch of stride 0 as well (tma_extent).
template <bool kExpandedOk = false>
bool tma_tensor_ok(int64_t row_stride, int64_t head_stride, int64_t batch_stride, int64_t rows, int64_t heads,
                   int64_t batch) {
  if constexpr (kExpandedOk) {
    heads = tma_extent(head_stride, heads);
    batch = tma_extent(batch_stride, batch);
  }
  return tma_stride_ok(row_stride, rows) && tma_stride_ok(head_stride, heads) && tma_stride_ok(batch_stride, batch);
}

// q, k and v as the TMA kernels see them (a varlen batch: one packed
// sequence of total rows).
template <bool kExpandedOk = false, class Params>
bool tma_qkv_ok(const Params& p) {
  const bool varlen = is_varlen(p);
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q, rows_k = varlen ? p.total_k : p.seqlen_k;
  const int64_t batch = varlen ? 1 : p.batch;
  return tma_tensor_ok<kExpandedOk>(p.q_row_stride, p.q_head_stride, p.q_batch_stride, rows_q, p.nheads, batch) &&
         tma_tensor_ok<kExpandedOk>(p.k_row_stride, p.k_head_stride, p.k_batch_stride, rows_k, p.nheads_k, batch) &&
         tma_tensor_ok<kExpandedOk>(p.v_row_stride, p.v_head_stride, p.v_batch_stride, rows_k, p.nheads_k, batch);
}

inline bool fwd_supports(const FwdParams& p) {
  return tma_qkv_ok</*kExpandedOk=*/true>(p);
}

// The sm90 backward (sm90/bwd_ws_kernel.hpp) reads q, dout, k and v
// through TMA, the other tensors with plain loads and stores; dropout runs
// the SM80 kernels, which flashtile::bwd also sends the other strides to.
inline bool bwd_supports(const BwdParams& p) {
  const bool varlen = is_varlen(p);
  return p.dropout_p == 0.f && tma_qkv_ok(p) &&
         tma_tensor_ok(p.dout_row_stride, p.dout_head_stride, p.dout_batch_stride, varlen ? p.total_q : p.seqlen_q,
                       p.nheads, varlen ? 1 : p.batch);
}

}  // namespace flashtile::sm90
