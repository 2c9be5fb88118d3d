// Attention against a KV cache (kvcache_params.hpp), split along the keys.
// One CTA takes 16 packed query rows of one (batch, KV head) — the rows are
// (query, head) pairs of the heads that share that KV head, so their keys
// and values are read once for all of them — and one split of the key
// blocks they see. Decoding has one query per sequence: the rows are few,
// the keys many, and the kernel is a stream of cache reads that must keep
// HBM busy. So the warps do not divide the rows, as the forward's do; each
// key group (one warp, or at d256 two, each with half of O's columns) takes
// its own 16 keys of every key block, with a softmax state of its own:
//
//   load Q's 16 rows; start loading key blocks 0 .. kStages−2
//   for each key block n of this split:
//     wait K[n], V[n]; start loading block n + kStages − 1 into the
//       stage every warp has finished with
//     each warp: S = Q·K[n, its group's 16 keys]ᵀ, softcap, ALiBi, mask,
//       online softmax, O[:, its columns] += P·V[n, its group's 16 keys]
//   merge the key groups' (max, sum, O) in shared memory
//   one split: write O and the logsumexp; several: write the normalized
//     partial O and its logsumexp (fp32) for the combine kernel
//
// Key rows are gathered one by one (16-byte cp.async per thread, a warp
// covering whole rows), so a paged cache has the dense one's access pattern
// whatever its page size; each row's page is looked up one or two key
// blocks before its copy is issued (Traits::kLocateAhead). Rows past the
// sequence are zero-filled in shared memory: a NaN there would survive
// P = 0.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/fast_math.h>

#include <cstdint>

#include "flashtile/common/fragment.hpp"
#include "flashtile/common/mask.hpp"
#include "flashtile/common/score_mod.hpp"
#include "flashtile/common/seqlen.hpp"
#include "flashtile/common/softmax.hpp"
#include "flashtile/kvcache_params.hpp"

namespace flashtile::sm80 {

using namespace cute;

// The visible keys of one sequence: their count, where key 0 sits in the
// cache entry, and the cache row (page, row in page) of any key.
struct CacheKeys {
  int seqlen_k;   // keys this sequence attends: cache_seqlens − leftpad
  int start;      // cache position of key 0 (the leftpad)
  int entry;      // dense: the cache entry
  const int* pages;  // paged: this sequence's row of block_table, else nullptr
  // position -> (page, row): a multiply and a shift, where an integer
  // division cost ~30 instructions for each of a thread's rows of a block.
  cutlass::FastDivmod page_size;

  CUTE_DEVICE CacheKeys(KvCacheParams const& p, int batch) {
    const int end = p.cache_seqlens != nullptr ? clamp_int(p.cache_seqlens[batch], 0, p.seqlen_k) : p.seqlen_k;
    start = p.cache_leftpad != nullptr ? clamp_int(p.cache_leftpad[batch], 0, end) : 0;
    seqlen_k = end - start;
    entry = p.cache_batch_idx != nullptr ? p.cache_batch_idx[batch] : batch;
    pages = p.block_table != nullptr ? p.block_table + batch * p.block_table_batch_stride : nullptr;
    page_size = cutlass::FastDivmod(pages != nullptr ? p.page_size : 1);
  }

  // Where key `key` lives: its page (a dense cache's entry) and row there.
  // The page comes from block_table, a load: the kernel asks ahead of the
  // block's copy, so that load's latency hides behind compute. H200, d128,
  // batch 64, 4k / 64k keys, 16-token pages, x the copy bandwidth: 0.57 /
  // 0.59 with the lookup just before the copy, 0.77 / 0.81 with it a block
  // ahead, 0.94 / 1.02 with FastDivmod as well (the dense cache: 0.97 /
  // 1.06). The deeper pipeline asks two blocks ahead (KvCacheTraits::
  // kLocateAhead).
  CUTE_DEVICE int2 locate(int key) const {
    const int position = start + key;
    if (pages == nullptr) return make_int2(entry, position);
    int page, row;
    page_size(page, row, position);
    return make_int2(pages[page], row);
  }
};

template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads) kvcache_kernel(const __grid_constant__ KvCacheParams params) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  constexpr int kKeyGroups = Traits::kKeyGroups;
  constexpr int kOCols = Traits::kOCols;
  constexpr int kKeys = Traits::kKeysPerWarp;
  constexpr int kChunksPerRow = Traits::kChunksPerRow;
  constexpr int kChunkElems = 16 / int(sizeof(Element));
  using ShapeQ = Shape<Int<kBlockM>, Int<kHeadDim>>;       // Q
  using ShapeO = Shape<Int<kBlockM>, Int<kOCols>>;         // a warp's columns of O
  using ShapeKw = Shape<Int<kKeys>, Int<kHeadDim>>;        // a key group's keys of a block
  using ShapeVtw = Shape<Int<kOCols>, Int<kKeys>>;         // the same keys' Vᵀ, a warp's columns
  using ShapeS = Shape<Int<kBlockM>, Int<kKeys>>;          // a key group's scores

  extern __shared__ __align__(128) char smem[];

  const int split = int(blockIdx.x) % params.num_splits;
  const int m_block = int(blockIdx.x) / params.num_splits;
  const int head_k = blockIdx.y;
  const int batch = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int key_group = warp / Traits::kOSplit;
  const int o_part = warp % Traits::kOSplit;  // O's columns [o_part · kOCols, + kOCols)
  const int lane = tid % 32;
  const int group = params.nheads / params.nheads_k;
  const int seqlen_q = params.seqlen_q;
  const int rows = seqlen_q * group;  // packed rows of this (batch, KV head)
  const int row0 = m_block * kBlockM;
  const CacheKeys keys(params, batch);
  const int seqlen_k = keys.seqlen_k;

  // The keys these rows see: [key_lo, key_hi) (common/mask.hpp's rules,
  // per query). Windows are capped beyond any distance so sums stay in int.
  int window_left = params.window_left, window_right = params.window_right;
  resolve_mask(params.causal, window_left, window_right);
  const int far = seqlen_q + seqlen_k;
  const int left = window_left < 0 || window_left > far ? far : window_left;
  const int right = window_right < 0 || window_right > far ? far : window_right;
  const int offset = seqlen_k - seqlen_q;  // query i's diagonal is key i + offset
  const int q_first = row0 / group;
  const int q_last = min(rows - 1, row0 + kBlockM - 1) / group;
  const int key_lo = max(0, q_first + offset - left);
  const int key_hi = min(seqlen_k, q_last + offset + right + 1);
  const int n_lo = key_lo / kBlockN;
  const int n_hi = key_hi > key_lo ? ceil_div(key_hi, kBlockN) : n_lo;
  const int per_split = ceil_div(n_hi - n_lo, params.num_splits);
  const int n_begin = min(n_hi, n_lo + split * per_split);
  const int n_end = min(n_hi, n_begin + per_split);

  // Shared memory: Q | K stages | V stages; the merge reuses the stages.
  Element* q_smem = reinterpret_cast<Element*>(smem);
  Element* k_smem = q_smem + cosize_v<typename Traits::SmemLayoutQ>;
  constexpr int kStageElems = cosize_v<typename Traits::SmemLayoutKV>;
  Element* v_smem = k_smem + kStages * kStageElems;
  Tensor sQ = make_tensor(make_smem_ptr(q_smem), typename Traits::SmemLayoutQ{});  // (kBlockM, kHeadDim)
  auto stage_K = [&](int stage) {
    return make_tensor(make_smem_ptr(k_smem + stage * kStageElems), typename Traits::SmemLayoutKV{});
  };  // (kBlockN, kHeadDim)
  auto stage_V = [&](int stage) {
    return make_tensor(make_smem_ptr(v_smem + stage * kStageElems), typename Traits::SmemLayoutKV{});
  };  // (kBlockN, kHeadDim)
  auto stage_Vt = [&](int stage) {
    return make_tensor(make_smem_ptr(v_smem + stage * kStageElems), typename Traits::SmemLayoutVt{});
  };  // (kHeadDim, kBlockN)

  // Packed row r is query r / group of head head_k · group + r % group.
  auto q_row_offset = [&](int r, int64_t batch_stride, int64_t row_stride, int64_t head_stride) {
    return int64_t(batch) * batch_stride + int64_t(r / group) * row_stride +
           int64_t(head_k * group + r % group) * head_stride;
  };

  const auto* k_cache = static_cast<const Element*>(params.k_cache) + head_k * params.k_head_stride;
  const auto* v_cache = static_cast<const Element*>(params.v_cache) + head_k * params.v_head_stride;
  // K and V of key block n into a stage: 16-byte chunks, zeros past the
  // keys. A thread's chunks lie in kLoadsPerThread rows, located
  // kLocateAhead blocks before their copy: located[0] holds the rows of the
  // next block load_kv copies, located[j] those of the j-th block after it,
  // whose block_table reads are in flight meanwhile.
  constexpr int kLoadsPerThread = kBlockN * kChunksPerRow / Traits::kNThreads;
  constexpr int kAhead = Traits::kLocateAhead;
  int2 located[kAhead][kLoadsPerThread];  // (page, row in page) of each chunk's key; page -1 past the keys
  auto locate_rows = [&](int n) {  // block n's rows into the last slot
    CUTE_UNROLL
    for (int i = 0; i < kLoadsPerThread; ++i) {
      const int key = n * kBlockN + (tid + i * Traits::kNThreads) / kChunksPerRow;
      located[kAhead - 1][i] = key < seqlen_k ? keys.locate(key) : make_int2(-1, 0);
    }
  };
  auto advance_located = [&] {  // each slot takes the next one's block
    CUTE_UNROLL
    for (int j = 0; j + 1 < kAhead; ++j) {
      CUTE_UNROLL
      for (int i = 0; i < kLoadsPerThread; ++i) located[j][i] = located[j + 1][i];
    }
  };
  auto load_kv = [&](int stage) {  // the block located[0] holds
    Tensor sK = stage_K(stage);
    Tensor sV = stage_V(stage);
    CUTE_UNROLL
    for (int i = 0; i < kLoadsPerThread; ++i) {
      const int row = (tid + i * Traits::kNThreads) / kChunksPerRow;
      const int col = (tid + i * Traits::kNThreads) % kChunksPerRow * kChunkElems;
      void* k_dst = &sK(row, col);
      void* v_dst = &sV(row, col);
      const int2 at = located[0][i];
      if (at.x >= 0) {
        const Element* k_src = k_cache + at.x * params.k_page_stride + at.y * params.k_row_stride + col;
        const Element* v_src = v_cache + at.x * params.v_page_stride + at.y * params.v_row_stride + col;
        SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>::copy(*reinterpret_cast<const uint128_t*>(k_src),
                                                   *reinterpret_cast<uint128_t*>(k_dst));
        SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>::copy(*reinterpret_cast<const uint128_t*>(v_src),
                                                   *reinterpret_cast<uint128_t*>(v_dst));
      } else {
        *reinterpret_cast<uint4*>(k_dst) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(v_dst) = make_uint4(0, 0, 0, 0);
      }
    }
  };

  // Prologue: Q (rows past the packed rows zero) with the first stage.
  const auto* q = static_cast<const Element*>(params.q);
  for (int idx = tid; idx < kBlockM * kChunksPerRow; idx += Traits::kNThreads) {
    const int row = idx / kChunksPerRow;
    const int col = idx % kChunksPerRow * kChunkElems;
    void* dst = &sQ(row, col);
    if (row0 + row < rows) {
      const Element* src =
          q + q_row_offset(row0 + row, params.q_batch_stride, params.q_row_stride, params.q_head_stride) + col;
      SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>::copy(*reinterpret_cast<const uint128_t*>(src),
                                                 *reinterpret_cast<uint128_t*>(dst));
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
  }
  // Stage s takes block n_begin + s. After this, located[j] holds block
  // n_begin + kStages − 1 + j.
  CUTE_UNROLL
  for (int j = 0; j + 1 < kAhead; ++j) {
    if (n_begin + j < n_end) locate_rows(n_begin + j);
    advance_located();
  }
  CUTE_UNROLL
  for (int s = 0; s < kStages - 1; ++s) {
    if (n_begin + s < n_end) {
      if (n_begin + s + (kAhead - 1) < n_end) locate_rows(n_begin + s + (kAhead - 1));
      load_kv(s);
    }
    cp_async_fence();
    advance_located();
  }
  if (n_begin + kStages - 1 + (kAhead - 1) < n_end) locate_rows(n_begin + kStages - 1 + (kAhead - 1));

  // This warp's products and their ldmatrix partitions.
  typename Traits::WarpMma warp_mma;
  auto thr_mma = warp_mma.get_thread_slice(lane);
  // (Fragments take their shapes from compact views; the swizzle does not matter there.)
  auto shaped = [&](auto shape) { return make_tensor(make_smem_ptr(q_smem), make_layout(shape)); };
  Tensor tSrQ = thr_mma.partition_fragment_A(shaped(ShapeQ{}));    // (MMA, 1, kHeadDim/16)
  Tensor tSrK = thr_mma.partition_fragment_B(shaped(ShapeKw{}));   // (MMA, kKeys/8, kHeadDim/16)
  Tensor tOrVt = thr_mma.partition_fragment_B(shaped(ShapeVtw{}));  // (MMA, kOCols/8, 1)
  Tensor acc_o = partition_fragment_C(warp_mma, ShapeO{});                       // (MMA, 1, kOCols/8)
  Tensor tScS = thr_mma.partition_C(make_identity_tensor(ShapeS{}));              // (MMA, 1, kKeys/8) -> (row, col)
  auto smem_copy_Q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, warp_mma);
  auto smem_copy_K = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, warp_mma);
  auto smem_copy_V = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, warp_mma);
  auto smem_thr_copy_Q = smem_copy_Q.get_slice(lane);
  auto smem_thr_copy_K = smem_copy_K.get_slice(lane);
  auto smem_thr_copy_V = smem_copy_V.get_slice(lane);
  Tensor tSrQ_view = smem_thr_copy_Q.retile_D(tSrQ);    // (CPY, 1, kHeadDim/16)
  Tensor tSrK_view = smem_thr_copy_K.retile_D(tSrK);    // (CPY, kKeys/16, kHeadDim/16)
  Tensor tOrVt_view = smem_thr_copy_V.retile_D(tOrVt);  // (CPY, kOCols/16, 1)

  // This thread's two rows (c0 and c2 of the m16n8 accumulator): their
  // queries and, with ALiBi, slopes.
  const ScoreMod<true> score_mod(params.softmax_scale, params.softcap, seqlen_q, seqlen_k, 0.f);
  const float scale = score_mod.score_scale();
  Tensor tScS_rowcol = rowcol_view(tScS);  // (2, cols) -> (row, col)
  int row_query[2];
  float row_slope[2];  // ALiBi slope over scale, 0 without ALiBi
  CUTE_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int packed = row0 + get<0>(tScS_rowcol(r, 0));
    row_query[r] = packed / group;
    const int head = head_k * group + packed % group;
    row_slope[r] = params.alibi_slopes != nullptr && packed < rows
                       ? params.alibi_slopes[batch * params.alibi_slopes_batch_stride +
                                             head * params.alibi_slopes_head_stride] / scale
                       : 0.f;
  }
  const bool has_alibi = params.alibi_slopes != nullptr;
  const bool has_softcap = score_mod.has_softcap();

  OnlineSoftmax<2> softmax(scale * float(M_LOG2E));
  clear(acc_o);
  Tensor acc_o_rowcol = rowcol_view(acc_o);  // (2, kOCols)

  for (int n = n_begin; n < n_end; ++n) {
    const int i = n - n_begin;
    cp_async_wait<kStages - 2>();
    __syncthreads();  // block n (and Q) landed; every warp is done with the stage refilled below
    if (n + kStages - 1 < n_end) {
      load_kv((i + kStages - 1) % kStages);  // block n + kStages − 1
      advance_located();
      if (n + kStages + (kAhead - 1) < n_end) locate_rows(n + kStages + (kAhead - 1));  // copied kAhead iterations on
    }
    cp_async_fence();
    const int stage = i % kStages;
    Tensor sKw = local_tile(stage_K(stage), ShapeKw{}, make_coord(key_group, 0));         // (kKeys, kHeadDim)
    Tensor sVtw = local_tile(stage_Vt(stage), ShapeVtw{}, make_coord(o_part, key_group));  // (kOCols, kKeys)
    Tensor acc_s = partition_fragment_C(warp_mma, ShapeS{});  // (MMA, 1, kKeys/8)
    clear(acc_s);
    if constexpr (Traits::kStreamQK) {
      // Q and K a 16-column slice at a time, the next slice's ldmatrix ahead
      // of this one's product: neither operand stays whole in registers.
      Tensor tSsQ = smem_thr_copy_Q.partition_S(sQ);   // (CPY, 1, kHeadDim/16)
      Tensor tSsK = smem_thr_copy_K.partition_S(sKw);  // (CPY, kKeys/16, kHeadDim/16)
      copy(smem_copy_Q, tSsQ(_, _, 0), tSrQ_view(_, _, 0));
      copy(smem_copy_K, tSsK(_, _, 0), tSrK_view(_, _, 0));
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tSrQ); ++k) {
        if (k + 1 < size<2>(tSrQ)) {
          copy(smem_copy_Q, tSsQ(_, _, k + 1), tSrQ_view(_, _, k + 1));
          copy(smem_copy_K, tSsK(_, _, k + 1), tSrK_view(_, _, k + 1));
        }
        gemm(warp_mma, tSrQ(_, _, k), tSrK(_, _, k), acc_s);
      }
    } else {
      if (i == 0) copy(smem_copy_Q, smem_thr_copy_Q.partition_S(sQ), tSrQ_view);
      copy(smem_copy_K, smem_thr_copy_K.partition_S(sKw), tSrK_view);
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tSrQ); ++k) gemm(warp_mma, tSrQ(_, _, k), tSrK(_, _, k), acc_s);
    }
    // V's ldmatrix overlaps the softmax, but for kStreamQK, where its
    // fragment (48 registers at d192) would sit beside the O accumulator
    // through it.
    if constexpr (!Traits::kStreamQK) copy(smem_copy_V, smem_thr_copy_V.partition_S(sVtw), tOrVt_view);

    Tensor scores = rowcol_view(acc_s);  // (2, kKeys/4)
    if (has_softcap) score_mod.apply_softcap(acc_s);
    const int key0 = n * kBlockN + key_group * kKeys;
    if (has_alibi) {
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(scores); ++c) {
          const int key = key0 + get<1>(tScS_rowcol(r, c));
          scores(r, c) -= row_slope[r] * fabsf(float(row_query[r] + offset - key));
        }
      }
    }
    // Blocks wholly inside every row's window and the sequence skip the mask.
    const bool masked = (n + 1) * kBlockN > seqlen_k || (n + 1) * kBlockN - 1 > q_first + offset + right ||
                        n * kBlockN < q_last + offset - left;
    if (masked) {
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(scores); ++c) {
          const int key = key0 + get<1>(tScS_rowcol(r, c));
          const int diagonal = row_query[r] + offset;
          if (key >= seqlen_k || key > diagonal + right || key < diagonal - left) scores(r, c) = -INFINITY;
        }
      }
    }
    softmax.update(scores, acc_o_rowcol);
    if constexpr (Traits::kStreamQK) copy(smem_copy_V, smem_thr_copy_V.partition_S(sVtw), tOrVt_view);
    Tensor rP = convert_fragment<Element>(acc_s);
    Tensor tOrP = make_tensor(rP.data(), acc_to_operand_a_layout(rP.layout()));  // ((2,2,2), 1, 1)
    gemm(warp_mma, tOrP(_, _, 0), tOrVt(_, _, 0), acc_o);
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the stages the merge reuses

  // Merge the key groups: each writes its row maxima (raw score units), row
  // sums and unnormalized O; then every thread combines a slice of the rows.
  float* merge_o = reinterpret_cast<float*>(k_smem);             // (kKeyGroups, kBlockM, kHeadDim)
  float* merge_max = merge_o + kKeyGroups * kBlockM * kHeadDim;  // (kKeyGroups, kBlockM)
  float* merge_sum = merge_max + kKeyGroups * kBlockM;           // (kKeyGroups, kBlockM)
  Tensor tOcO = rowcol_view(thr_mma.partition_C(make_identity_tensor(ShapeO{})));  // (2, kOCols) -> (row, col)
  CUTE_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int row = get<0>(tOcO(r, 0));
    const float sum = quad_allreduce(softmax.row_sum(r), SumOp{});
    if (lane % 4 == 0 && o_part == 0) {  // a group's warps hold the same maxima and sums
      merge_max[key_group * kBlockM + row] = softmax.row_max(r);
      merge_sum[key_group * kBlockM + row] = sum;
    }
    CUTE_UNROLL
    for (int c = 0; c < size<1>(acc_o_rowcol); ++c) {
      merge_o[(key_group * kBlockM + row) * kHeadDim + o_part * kOCols + get<1>(tOcO(r, c))] = acc_o_rowcol(r, c);
    }
  }
  __syncthreads();

  constexpr int kThreadsPerRow = Traits::kNThreads / kBlockM;
  constexpr int kColsPerThread = kHeadDim / kThreadsPerRow;
  static_assert(kColsPerThread % 4 == 0);
  const int row = tid / kThreadsPerRow;
  const int col0 = (tid % kThreadsPerRow) * kColsPerThread;
  const float scale_log2 = scale * float(M_LOG2E);
  float row_max = -INFINITY;
  CUTE_UNROLL
  for (int w = 0; w < kKeyGroups; ++w) row_max = fmaxf(row_max, merge_max[w * kBlockM + row]);
  float factor[kKeyGroups];
  float row_sum = 0.f;
  CUTE_UNROLL
  for (int w = 0; w < kKeyGroups; ++w) {
    const float m = merge_max[w * kBlockM + row];
    factor[w] = m == -INFINITY ? 0.f : fast_exp2((m - row_max) * scale_log2);
    row_sum += factor[w] * merge_sum[w * kBlockM + row];
  }
  // A row that saw no key: O = 0 and logsumexp −inf (as the forward).
  const float inv_sum = row_sum == 0.f ? 0.f : 1.f / row_sum;
  const float lse = row_sum == 0.f ? -INFINITY : row_max * scale + __logf(row_sum);
  float o[kColsPerThread];
  CUTE_UNROLL
  for (int c = 0; c < kColsPerThread; ++c) {
    float acc = 0.f;
    CUTE_UNROLL
    for (int w = 0; w < kKeyGroups; ++w) acc += factor[w] * merge_o[(w * kBlockM + row) * kHeadDim + col0 + c];
    o[c] = acc * inv_sum;
  }

  const int packed = row0 + row;
  if (packed >= rows) return;
  const int query = packed / group;
  const int head = head_k * group + packed % group;
  const int64_t lse_row = (int64_t(batch) * params.nheads + head) * seqlen_q + query;
  const bool first_of_row = tid % kThreadsPerRow == 0;
  if (params.num_splits == 1) {
    Element* out = static_cast<Element*>(params.out) +
                   q_row_offset(packed, params.out_batch_stride, params.out_row_stride, params.out_head_stride) + col0;
    CUTE_UNROLL
    for (int c = 0; c < kColsPerThread; c += 4) {
      cutlass::Array<Element, 4> v;
      CUTE_UNROLL
      for (int j = 0; j < 4; ++j) v[j] = Element(o[c + j]);
      *reinterpret_cast<cutlass::Array<Element, 4>*>(out + c) = v;
    }
    if (first_of_row) params.lse[lse_row] = lse;
  } else {
    const KvCacheWorkspace workspace(params);
    const int64_t partial_row = split * workspace.rows + lse_row;
    float* out = workspace.out(params.workspace, params.num_splits) + partial_row * kHeadDim + col0;
    CUTE_UNROLL
    for (int c = 0; c < kColsPerThread; c += 4) {
      *reinterpret_cast<float4*>(out + c) = make_float4(o[c], o[c + 1], o[c + 2], o[c + 3]);
    }
    if (first_of_row) workspace.lse(params.workspace)[partial_row] = lse;
  }
}

// Combines the num_splits partials of each (batch, head, query) row: one
// CTA a row, weights exp(lse_s − lse) with lse = log Σ exp(lse_s). The
// splits' logsumexps go through shared memory; then each warp sums every
// kCombineWarps-th split's partial O, a float4 of the row a lane, loads of
// several splits in flight, and the warps' sums are added. (One warp a row,
// its splits in sequence: 5.7 µs for batch 1, 32 heads, 32 splits on the
// H200, against 8.5 µs for the attention itself.)
inline constexpr int kCombineWarps = 4;

template <int kHeadDim, class Element>
__global__ void __launch_bounds__(32 * kCombineWarps)
    kvcache_combine_kernel(const __grid_constant__ KvCacheParams params) {
  constexpr int kChunks = kHeadDim / 4;  // float4s of a row
  constexpr int kChunksPerLane = (kChunks + 31) / 32;
  __shared__ float lse_split[kMaxKvCacheSplits];
  __shared__ float4 partial_sum[kCombineWarps][kChunks];
  const KvCacheWorkspace workspace(params);
  const int64_t row = blockIdx.x;
  const int splits = params.num_splits;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const float* lse_partial = workspace.lse(params.workspace) + row;
  for (int s = threadIdx.x; s < splits; s += blockDim.x) lse_split[s] = lse_partial[s * workspace.rows];
  __syncthreads();
  float lse_max = -INFINITY;
  for (int s = 0; s < splits; ++s) lse_max = fmaxf(lse_max, lse_split[s]);
  float sum = 0.f;
  if (lse_max != -INFINITY) {
    for (int s = 0; s < splits; ++s) sum += __expf(lse_split[s] - lse_max);
  }
  // A row no split saw a key of: O = 0 and logsumexp −inf.
  const float lse = sum == 0.f ? -INFINITY : lse_max + __logf(sum);

  const float* out_partial = workspace.out(params.workspace, splits) + row * kHeadDim;
  float4 acc[kChunksPerLane];
  CUTE_UNROLL
  for (int i = 0; i < kChunksPerLane; ++i) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (lse != -INFINITY) {
#pragma unroll 4
    for (int s = warp; s < splits; s += kCombineWarps) {
      const float w = __expf(lse_split[s] - lse);
      const float4* o = reinterpret_cast<const float4*>(out_partial + s * workspace.rows * kHeadDim);
      CUTE_UNROLL
      for (int i = 0; i < kChunksPerLane; ++i) {
        const int c = lane + 32 * i;
        if (c < kChunks) {
          const float4 v = o[c];
          acc[i].x += w * v.x;
          acc[i].y += w * v.y;
          acc[i].z += w * v.z;
          acc[i].w += w * v.w;
        }
      }
    }
  }
  CUTE_UNROLL
  for (int i = 0; i < kChunksPerLane; ++i) {
    if (lane + 32 * i < kChunks) partial_sum[warp][lane + 32 * i] = acc[i];
  }
  __syncthreads();

  // Row index (batch, head, query) -> out's element offset.
  const int query = int(row % params.seqlen_q);
  const int head = int(row / params.seqlen_q % params.nheads);
  const int batch = int(row / (int64_t(params.seqlen_q) * params.nheads));
  Element* out = static_cast<Element*>(params.out) + batch * params.out_batch_stride +
                 query * params.out_row_stride + head * params.out_head_stride;
  for (int c = threadIdx.x; c < kChunks; c += blockDim.x) {
    float4 total = partial_sum[0][c];
    CUTE_UNROLL
    for (int w = 1; w < kCombineWarps; ++w) {
      total.x += partial_sum[w][c].x;
      total.y += partial_sum[w][c].y;
      total.z += partial_sum[w][c].z;
      total.w += partial_sum[w][c].w;
    }
    cutlass::Array<Element, 4> v;
    v[0] = Element(total.x);
    v[1] = Element(total.y);
    v[2] = Element(total.z);
    v[3] = Element(total.w);
    *reinterpret_cast<cutlass::Array<Element, 4>*>(out + 4 * c) = v;
  }
  if (threadIdx.x == 0) params.lse[row] = lse;
}

}  // namespace flashtile::sm80
