// Host API of attention against a KV cache (kvcache_params.hpp): argument
// checks, the split count, the workspace size and the dispatch; and of the
// append of new keys and values with their rotary embedding.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "flashtile/head_dims.hpp"
#include "flashtile/kvcache_params.hpp"
#include "flashtile/kvcache_registry.hpp"
#include "flashtile/layout_checks.hpp"
#include "flashtile/sm90/device.hpp"
#include "flashtile/status.hpp"

namespace flashtile {

// Split count for params' shapes on a GPU with sm_count SMs, deep_fits
// saying whether the head dim's deeper pipeline runs there
// (kvcache_params.hpp). Without a split, a CTA takes 16 packed query rows
// of one (batch, KV head); decoding has few of those and must still keep
// HBM busy. A split streams ceil(blocks / splits) 64-key blocks of the
// longest sequence the cache holds (params.seqlen_k: the device's actual
// lengths are never read here). The model, per SM: its CTAs run two at a
// time (registers, at head dim 128); each keeps one key block in flight,
// the deeper pipeline two, and two blocks in flight an SM keep HBM as busy
// as it gets, so an SM's time is its blocks over its blocks in flight,
// plus a prologue and epilogue (two blocks' time) for each pair of CTAs.
// A count is taken only where it models 10 % faster than the fewer splits
// already chosen: each split adds a partial to write and combine, which
// the model leaves out. Measured on the H200 (batch x keys, d128, 32 query
// heads on 8 KV heads, µs in a CUDA graph): 1 x 4k 16 splits 16.8, 32
// splits 18.3; 1 x 16k 16 splits 32.0, 32 splits 33.5; 8 x 1k 2 splits
// 21.7, 4 splits 22.4; 8 x 4k 4 splits (deep) 50.0, 3 (not) 53.0, 2 (not)
// 57.6; 64 x 128k 1 split 7648, 17 splits (modelled 1 % faster) 7792.
inline int pick_kvcache_splits(const KvCacheParams& p, int sm_count, bool deep_fits = false) {
  const int group = p.nheads / p.nheads_k;
  const int64_t ctas = int64_t((int64_t(p.seqlen_q) * group + 15) / 16) * p.nheads_k * p.batch;
  const int64_t sms = std::max(sm_count, 1);
  if (ctas >= 8 * sms) return 1;  // four pairs of CTAs an SM or more: the last is a small part of the time
  const int64_t blocks = kvcache_blocks_per_split(p, 1);
  const int most = int(std::min<int64_t>(kMaxKvCacheSplits, blocks));
  int best = 1;
  int64_t best_time = -1;
  for (int s = 1; s <= most; ++s) {
    const int64_t per_split = kvcache_blocks_per_split(p, s);
    const int64_t busy = (blocks + per_split - 1) / per_split;  // splits with blocks
    const int64_t per_sm = (ctas * busy + sms - 1) / sms;        // CTAs an SM runs
    const int64_t in_flight = std::min<int64_t>(2, std::min<int64_t>(per_sm, 2) *
                                                       (kvcache_takes_deep_pipeline(p, s, deep_fits) ? 2 : 1));
    // In half-block units: blocks x 2 / in_flight, 4 a pair of CTAs.
    const int64_t time = per_sm * per_split * (2 / in_flight) + 4 * ((per_sm + 1) / 2);
    if (best_time < 0 || 10 * time < 9 * best_time) best = s, best_time = time;
  }
  return best;
}

// Whether the kernels registered for params' head dim and dtype have a
// deeper pipeline that fits the current GPU.
inline bool kvcache_deep_fits(const KvCacheParams& p) {
  const KvCacheRegistry::Entry* entry = KvCacheRegistry::instance().find_entry(p.head_dim, p.dtype);
  return entry != nullptr && kvcache_deep_fits(entry->deep_smem_bytes);
}

// params.num_splits, or the choice for the current GPU when it is 0.
inline int resolve_kvcache_splits(const KvCacheParams& p) {
  if (p.num_splits > 0) return p.num_splits;
  return pick_kvcache_splits(p, std::max(1, sm90::multiprocessor_count()),  // (a query that works on any GPU)
                             kvcache_deep_fits(p));
}

// Bytes of workspace kvcache() needs for params (0 without a split).
inline int64_t kvcache_workspace_bytes(const KvCacheParams& p) {
  const int splits = resolve_kvcache_splits(p);
  return splits > 1 ? KvCacheWorkspace(p).bytes(splits, p.head_dim) : 0;
}

// Checks everything the kernels assume about params, without touching the
// GPU (cache_seqlens, cache_leftpad, cache_batch_idx and block_table hold
// device values, which the kernels clamp or trust: entries and pages must
// exist).
inline Status can_implement_kvcache(const KvCacheParams& p) {
  if (!p.q || !p.k_cache || !p.v_cache || !p.out || !p.lse) return Status::kInvalidArgument;
  if (p.batch < 1 || p.nheads < 1 || p.nheads_k < 1 || p.seqlen_q < 1 || p.seqlen_k < 0 ||
      p.nheads % p.nheads_k != 0 || p.batch > 65535 || p.nheads_k > 65535) {
    return Status::kInvalidArgument;
  }
  constexpr int kMaxRows = 1 << 29;  // the mask arithmetic's bound, as kMaxSeqlen
  if (int64_t(p.seqlen_q) * (p.nheads / p.nheads_k) > kMaxRows || p.seqlen_k > kMaxRows) {
    return Status::kInvalidArgument;
  }
  if (!is_supported_head_dim(p.head_dim)) return Status::kUnsupportedHeadDim;
  if (p.num_splits < 0 || p.num_splits > kMaxKvCacheSplits) return Status::kInvalidArgument;
  if (int64_t(p.batch) * p.nheads * p.seqlen_q > 2147483647) return Status::kInvalidArgument;  // combine grid
  if (!(p.softmax_scale > 0.f) || p.window_left < -1 || p.window_right < -1) return Status::kInvalidArgument;
  if (!(p.softcap >= 0.f && p.softcap <= 3.4e38f)) return Status::kInvalidArgument;
  if (p.block_table != nullptr && (p.page_size < 1 || p.block_table_batch_stride < 0 || p.cache_batch_idx)) {
    return Status::kInvalidArgument;
  }
  if (!strides_non_negative({p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.k_page_stride, p.k_row_stride,
                             p.k_head_stride, p.v_page_stride, p.v_row_stride, p.v_head_stride, p.out_batch_stride,
                             p.out_row_stride, p.out_head_stride}) ||
      !non_overlapping(p.batch, p.seqlen_q, p.nheads, p.head_dim, p.out_batch_stride, p.out_row_stride,
                       p.out_head_stride)) {
    return Status::kInvalidArgument;
  }
  const bool aligned = vector_aligned(p.q, {p.q_batch_stride, p.q_row_stride, p.q_head_stride}) &&
                       vector_aligned(p.k_cache, {p.k_page_stride, p.k_row_stride, p.k_head_stride}) &&
                       vector_aligned(p.v_cache, {p.v_page_stride, p.v_row_stride, p.v_head_stride}) &&
                       vector_aligned(p.out, {p.out_batch_stride, p.out_row_stride, p.out_head_stride});
  if (!aligned) return Status::kMisalignedPointer;
  return Status::kSuccess;
}

// Runs the KV-cache kernels registered for (head_dim, dtype). With
// params.num_splits = 0 the split count is resolve_kvcache_splits()'s, and
// params.workspace must hold kvcache_workspace_bytes(params).
inline Status kvcache(const KvCacheParams& params, cudaStream_t stream) {
  const Status ok = can_implement_kvcache(params);
  if (ok != Status::kSuccess) return ok;
  KvCacheParams p = params;
  p.num_splits = resolve_kvcache_splits(params);
  if (p.num_splits > 1 && (p.workspace == nullptr || reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0)) {
    return Status::kInvalidArgument;
  }
  const KvCacheLauncher launch = KvCacheRegistry::instance().find(p.head_dim, p.dtype);
  if (!launch) return Status::kNotBuilt;
  return launch(p, stream);
}

// Checks what the append kernel assumes about params without touching the
// GPU (cache_seqlens, block_table and cache_batch_idx are device values:
// positions outside an entry are skipped, pages and entries must exist).
inline Status can_implement_kvcache_append(const KvAppendParams& p) {
  if (!p.cache_seqlens || (p.k == nullptr) != (p.v == nullptr)) return Status::kInvalidArgument;
  if (p.k && (!p.k_cache || !p.v_cache)) return Status::kInvalidArgument;
  if (p.q_out && (!p.q || !p.rotary_cos)) return Status::kInvalidArgument;
  if ((p.rotary_cos == nullptr) != (p.rotary_sin == nullptr)) return Status::kInvalidArgument;
  if (p.batch < 1 || p.nheads_k < 1 || p.seqlen_new < 0 || p.seqlen_k < 0 || p.head_dim < 1 ||
      p.head_dim > kMaxHeadDim || (p.k && p.seqlen_new < 1) || (p.q_out && (p.seqlen_q < 1 || p.nheads < 1))) {
    return Status::kInvalidArgument;
  }
  if (p.rotary_cos && (p.rotary_dim < 2 || p.rotary_dim % 2 != 0 || p.rotary_dim > p.head_dim ||
                       p.seqlen_ro < 0 || p.rotary_row_stride < 0 || p.rotary_col_stride < 0)) {
    return Status::kInvalidArgument;
  }
  if (p.block_table != nullptr && (p.page_size < 1 || p.block_table_batch_stride < 0 || p.cache_batch_idx)) {
    return Status::kInvalidArgument;
  }
  const int64_t rows = (p.q_out ? int64_t(p.batch) * p.seqlen_q * p.nheads : 0) +
                       (p.k ? int64_t(p.batch) * p.seqlen_new * p.nheads_k : 0);
  if (rows > int64_t(2147483647) * 4) return Status::kInvalidArgument;  // the grid, a row a warp
  if (!strides_non_negative({p.k_batch_stride, p.k_row_stride, p.k_head_stride, p.k_dim_stride, p.v_batch_stride,
                             p.v_row_stride, p.v_head_stride, p.v_dim_stride, p.k_page_stride, p.k_cache_row_stride,
                             p.k_cache_head_stride, p.k_cache_dim_stride, p.v_page_stride, p.v_cache_row_stride,
                             p.v_cache_head_stride, p.v_cache_dim_stride, p.q_batch_stride, p.q_row_stride,
                             p.q_head_stride, p.q_dim_stride, p.q_out_batch_stride, p.q_out_row_stride,
                             p.q_out_head_stride})) {
    return Status::kInvalidArgument;
  }
  return Status::kSuccess;
}

// Appends and rotates (KvAppendParams) with the kernel registered for
// params.dtype.
inline Status kvcache_append(const KvAppendParams& params, cudaStream_t stream) {
  const Status ok = can_implement_kvcache_append(params);
  if (ok != Status::kSuccess) return ok;
  const KvAppendLauncher launch = KvCacheRegistry::instance().find_append(params.dtype);
  if (!launch) return Status::kNotBuilt;
  return launch(params, stream);
}

}  // namespace flashtile
