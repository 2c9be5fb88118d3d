// Arguments of attention against a KV cache (flash_attn_with_kvcache): a few
// new queries per sequence against the keys and values already cached, the
// cache either dense or paged. Strides are in elements and 64-bit, as in
// params.hpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "flashtile/device_attribute.hpp"
#include "flashtile/params.hpp"

namespace flashtile {

// At most this many CTAs share the keys of one (batch, KV head).
inline constexpr int kMaxKvCacheSplits = 128;

// out = softmax(q kᵀ · softmax_scale) v for each (batch, query head), where
// the keys and values of sequence b are rows [leftpad_b, seqlen_b) of its
// cache entry:
//   dense  k_cache (batch_cache, seqlen_cache, nheads_k, head_dim); sequence
//          b's entry is cache_batch_idx[b] (b when nullptr);
//   paged  k_cache (num_pages, page_size, nheads_k, head_dim) and block_table
//          (batch, max_pages) int32: key position p of sequence b lives in
//          page block_table[b, p / page_size], row p % page_size. Pages of
//          any size from 1.
// seqlen_b = cache_seqlens[b] (int32 on the device; seqlen_k for every
// sequence when nullptr) and leftpad_b = cache_leftpad[b] (0 when nullptr),
// both clamped to [0, seqlen_k], which is what an entry can hold. The
// sequence's keys are numbered from 0 at leftpad_b, and the masks, window
// and ALiBi align to the bottom-right corner of its (seqlen_q, seqlen_b −
// leftpad_b) matrix, as FwdParams'.
//
// The keys of one (batch, KV head) may be split across num_splits CTAs
// (split-KV): each writes a partial output and logsumexp to the workspace
// and a second kernel combines them. num_splits = 0 lets kvcache()
// (kvcache.hpp) choose from the shapes and the GPU's SM count, never from
// device data, so a decode step can be captured in a CUDA graph;
// kvcache_workspace_bytes() says what the workspace needs for that choice.
struct KvCacheParams {
  const void* q = nullptr;          // (batch, seqlen_q, nheads, head_dim)
  const void* k_cache = nullptr;    // dense or paged, above
  const void* v_cache = nullptr;    // k_cache's shape
  void* out = nullptr;              // q's shape
  float* lse = nullptr;             // (batch, nheads, seqlen_q) fp32, contiguous
  void* workspace = nullptr;        // kvcache_workspace_bytes(params) bytes when num_splits > 1

  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  // A page's stride is a dense cache's batch stride.
  int64_t k_page_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_page_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;

  const int* block_table = nullptr;  // paged when set
  int64_t block_table_batch_stride = 0;
  int page_size = 0;                 // paged: rows of a page
  const int* cache_batch_idx = nullptr;
  const int* cache_seqlens = nullptr;
  const int* cache_leftpad = nullptr;

  int batch = 0;
  int nheads = 0;
  int nheads_k = 0;  // nheads % nheads_k == 0
  int seqlen_q = 0;
  int seqlen_k = 0;  // keys an entry can hold: seqlen_cache, or max_pages · page_size
  int head_dim = 0;

  float softmax_scale = 0.f;
  bool causal = false;  // as FwdParams
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.f;
  const float* alibi_slopes = nullptr;
  int64_t alibi_slopes_batch_stride = 0, alibi_slopes_head_stride = 1;

  int num_splits = 0;  // 0: chosen by kvcache(); the kernels see >= 1
  DType dtype = DType::kBf16;
};

// flash_attn_with_kvcache's new keys and values and its rotary embedding,
// applied before the attention in one kernel (sm80/kvcache_append_kernel.hpp):
// row i < seqlen_new of k and v for sequence b goes into its cache at key
// position pos = seqlen_b + i (seqlen_b = cache_seqlens[b]; the entry and
// pages as KvCacheParams'), and a row whose pos is outside [0, seqlen_k)
// (what an entry holds) is not written. With rotary_cos and rotary_sin (both
// (seqlen_ro, rotary_dim / 2) tables) the key row is rotated by the angles of
// row pos, and q is rotated into q_out: row i by those of seqlen_b + i, or of
// seqlen_b for every row when q_rows_share_position. Features (j, j +
// rotary_dim / 2), or (2j, 2j + 1) when rotary_interleaved, are the pairs
// rotated by angle j; a position outside [0, seqlen_ro) rotates by nothing.
// cache_seqlens_out (when set) gets seqlen_b + seqlen_new. Strides are in
// elements, the last one (the feature stride) included.
struct KvAppendParams {
  const void* k = nullptr;  // (batch, seqlen_new, nheads_k, head_dim); nullptr: nothing appended
  const void* v = nullptr;  // k's shape
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0, k_dim_stride = 1;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0, v_dim_stride = 1;
  void* k_cache = nullptr;  // KvCacheParams' layouts
  void* v_cache = nullptr;
  int64_t k_page_stride = 0, k_cache_row_stride = 0, k_cache_head_stride = 0, k_cache_dim_stride = 1;
  int64_t v_page_stride = 0, v_cache_row_stride = 0, v_cache_head_stride = 0, v_cache_dim_stride = 1;
  const int* block_table = nullptr;  // paged when set
  int64_t block_table_batch_stride = 0;
  int page_size = 0;
  const int* cache_batch_idx = nullptr;
  const int* cache_seqlens = nullptr;  // (batch,) int32, required
  int* cache_seqlens_out = nullptr;    // (batch,) int32, or nullptr

  const void* q = nullptr;  // (batch, seqlen_q, nheads, head_dim), rotated into q_out
  void* q_out = nullptr;    // q's shape; nullptr: q is not rotated
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0, q_dim_stride = 1;
  int64_t q_out_batch_stride = 0, q_out_row_stride = 0, q_out_head_stride = 0;  // feature stride 1
  bool q_rows_share_position = false;

  const void* rotary_cos = nullptr;  // nullptr: no rotation
  const void* rotary_sin = nullptr;
  int64_t rotary_row_stride = 0, rotary_col_stride = 1;  // both tables'
  bool rotary_fp32 = false;  // the tables' type: float, else dtype
  bool rotary_interleaved = false;
  int rotary_dim = 0;  // even, <= head_dim
  int seqlen_ro = 0;

  int batch = 0;
  int seqlen_new = 0;
  int seqlen_q = 0;
  int nheads = 0;
  int nheads_k = 0;
  int head_dim = 0;
  int seqlen_k = 0;  // keys an entry can hold
  DType dtype = DType::kBf16;
};

// Where the split-KV partials live in KvCacheParams::workspace: the
// logsumexps (num_splits, batch, nheads, seqlen_q), then the outputs
// (num_splits, batch, nheads, seqlen_q, head_dim), fp32, each 16-byte
// aligned.
struct KvCacheWorkspace {
  int64_t rows;  // batch · nheads · seqlen_q

  FLASHTILE_HOST_DEVICE explicit KvCacheWorkspace(KvCacheParams const& p)
      : rows(int64_t(p.batch) * p.nheads * p.seqlen_q) {}
  FLASHTILE_HOST_DEVICE int64_t lse_floats(int num_splits) const { return (rows * num_splits + 3) / 4 * 4; }
  FLASHTILE_HOST_DEVICE int64_t bytes(int num_splits, int head_dim) const {
    return 4 * (lse_floats(num_splits) + rows * num_splits * head_dim);
  }
  FLASHTILE_HOST_DEVICE float* lse(void* workspace) const { return static_cast<float*>(workspace); }
  FLASHTILE_HOST_DEVICE float* out(void* workspace, int num_splits) const {
    return static_cast<float*>(workspace) + lse_floats(num_splits);
  }
};

// The split planner counts key blocks of this many keys (the d128 kernel's).
inline constexpr int kKvCacheBlockKeys = 64;

// Key blocks a split of params' longest sequence (seqlen_k) streams when
// its keys are cut into `splits`.
inline int64_t kvcache_blocks_per_split(KvCacheParams const& p, int splits) {
  const int64_t blocks = (int64_t(p.seqlen_k) + kKvCacheBlockKeys - 1) / kKvCacheBlockKeys;
  return (blocks + splits - 1) / splits;
}

// A head dim may have a deeper pipeline (sm80/kvcache_traits.hpp,
// kDeepStages): two key blocks in flight a CTA instead of one, in more
// shared memory than 99 KB. It pays where a CTA streams few blocks, its
// first load's latency a large part of its time, and loses 1-3 % on long
// streams. H200, d128, µs, 2 stages → 3 at the same split counts, one
// process: batch 8 x 1k (2 splits, 8 blocks each) 24.8 → 21.9, batch 1 x
// 16k (16 splits, 16 blocks) 38.0 → 32.0, batch 256 x 1k within ±2 %;
// batch 64 x 4k (64 blocks) 256.2 → 260.8, 64 x 64k 3804 → 3893.
inline constexpr int64_t kKvCacheDeepMaxBlocks = 16;

// Whether params' kernels run the deeper pipeline with `splits` splits,
// given whether the head dim has one that fits the GPU: splits of at most
// kKvCacheDeepMaxBlocks blocks, whatever the page size. Pages smaller than
// a block need several block_table reads a block; the kernel issues them
// two blocks ahead of the block's copy. Issued one block ahead they cost
// the deeper pipeline its gain: batch 1 x 16k, 16-token pages, 16 deep
// splits 37.3 µs against 32 shallow ones 34.6 (the dense cache: 32.0
// against 33.4).
inline bool kvcache_takes_deep_pipeline(KvCacheParams const& p, int splits, bool deep_fits) {
  return deep_fits && kvcache_blocks_per_split(p, splits) <= kKvCacheDeepMaxBlocks;
}

// Whether the current GPU gives a CTA deep_smem_bytes of shared memory
// (0: the head dim has no deeper pipeline).
inline bool kvcache_deep_fits(int deep_smem_bytes) {
  return deep_smem_bytes > 0 &&
         cached_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>() >= deep_smem_bytes;
}

}  // namespace flashtile
