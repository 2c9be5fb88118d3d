// The FlashAttention-2 forward kernel on the SM80 path (mma.sync, cp.async,
// ldmatrix). One CTA computes one (query block, head, batch) tile of O:
//
//   load Q block; load K[last]
//   for each visible key block n, last to first (blocks outside a window skipped):
//     wait K[n]; start loading V[n]
//     S = Q·K[n]ᵀ                        (registers, never written out)
//     softcap and ALiBi (kScoreMod kernels, common/score_mod.hpp)
//     mask S if the tile straddles the diagonal, a window edge or seqlen_k
//     wait V[n]; start loading K[n−1]
//     online softmax: P = exp2(S·c − m·c), rescale O where m moved
//     dropout (kScoreMod kernels, common/dropout.hpp): zero the dropped P
//     O += P·V[n]                          (P used from registers)
//   O /= rowsum (of the undropped P; times 1/(1 − p) with dropout); write O
//   and the row logsumexp
//
// K and V have one buffer each; each one's load overlaps the other's product.
// Walking the key blocks last-to-first puts the masked tiles first, where
// the causal diagonal and the partial seqlen_k tile live.
#pragma once

#include <cute/tensor.hpp>

#include <type_traits>

#include "flashtile/common/copy.hpp"
#include "flashtile/common/dropout.hpp"
#include "flashtile/common/fragment.hpp"
#include "flashtile/common/mask.hpp"
#include "flashtile/common/score_mod.hpp"
#include "flashtile/common/seqlen.hpp"
#include "flashtile/common/softmax.hpp"
#include "flashtile/params.hpp"
#include "flashtile/sm80/gemm.hpp"

namespace flashtile::sm80 {

using namespace cute;

template <class Traits, MaskKind kMask, bool kScoreMod, bool kVarlen>
__global__ void __launch_bounds__(Traits::kNThreads)
    fwd_kernel(const __grid_constant__ FwdParams params) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  using BlockShapeQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using BlockShapeKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using BlockShapeS = Shape<Int<kBlockM>, Int<kBlockN>>;
  static_assert(kBlockM % (16 * Traits::kNWarps) == 0, "each warp owns whole 16-row MMA slices");
  static_assert(kBlockN % 16 == 0 && kHeadDim % 16 == 0);

  extern __shared__ __align__(128) char smem[];

  // Causal: later query blocks visit more key blocks. Launching them first
  // (longest-first) keeps the grid's last wave short.
  const int m_block = kMask == MaskKind::kCausal ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int tid = threadIdx.x;
  const int head_k = head / (params.nheads / params.nheads_k);
  const SeqInfo seq(params, batch, std::bool_constant<kVarlen>{});
  const int seqlen_q = seq.seqlen_q;
  const int seqlen_k = seq.seqlen_k;
  if constexpr (kVarlen) {
    if (m_block * kBlockM >= seqlen_q) return;  // past this sequence's rows
  }
  const BlockMask<kMask, kBlockM, kBlockN> mask(seqlen_q, seqlen_k, params.window_left, params.window_right);
  const ScoreMod<kScoreMod> score_mod(params.softmax_scale, params.softcap, seqlen_q, seqlen_k,
                                      kScoreMod ? alibi_slope(params, batch, head) : 0.f);
  const Dropout<kScoreMod> dropout(params, batch);
  const int rows_valid = seqlen_q - m_block * kBlockM;

  // Global tensors of this (batch, head), then this CTA's tiles.
  Tensor mQ = make_tensor(make_gmem_ptr(static_cast<const Element*>(params.q) +
                                        seq.q_offset(params.q_batch_stride, params.q_row_stride) +
                                        head * params.q_head_stride),
                          make_shape(seqlen_q, Int<kHeadDim>{}),
                          make_stride(params.q_row_stride, _1{}));  // (seqlen_q, kHeadDim)
  Tensor mK = make_tensor(make_gmem_ptr(static_cast<const Element*>(params.k) +
                                        seq.k_offset(params.k_batch_stride, params.k_row_stride) +
                                        head_k * params.k_head_stride),
                          make_shape(seqlen_k, Int<kHeadDim>{}),
                          make_stride(params.k_row_stride, _1{}));  // (seqlen_k, kHeadDim)
  Tensor mV = make_tensor(make_gmem_ptr(static_cast<const Element*>(params.v) +
                                        seq.k_offset(params.v_batch_stride, params.v_row_stride) +
                                        head_k * params.v_head_stride),
                          make_shape(seqlen_k, Int<kHeadDim>{}),
                          make_stride(params.v_row_stride, _1{}));  // (seqlen_k, kHeadDim)
  Tensor mO = make_tensor(make_gmem_ptr(static_cast<Element*>(params.out) +
                                        seq.q_offset(params.out_batch_stride, params.out_row_stride) +
                                        head * params.out_head_stride),
                          make_shape(seqlen_q, Int<kHeadDim>{}),
                          make_stride(params.out_row_stride, _1{}));  // (seqlen_q, kHeadDim)
  float* lse_rows = params.lse + seq.row_index(params, head) + int64_t(m_block) * kBlockM;

  Tensor gQ = local_tile(mQ, BlockShapeQ{}, make_coord(m_block, 0));  // (kBlockM, kHeadDim)
  Tensor gK = local_tile(mK, BlockShapeKV{}, make_coord(_, 0));       // (kBlockN, kHeadDim, n_blocks)
  Tensor gV = local_tile(mV, BlockShapeKV{}, make_coord(_, 0));       // (kBlockN, kHeadDim, n_blocks)
  Tensor gO = local_tile(mO, BlockShapeQ{}, make_coord(m_block, 0));  // (kBlockM, kHeadDim)
  Tensor cQ = make_identity_tensor(BlockShapeQ{});                    // (kBlockM, kHeadDim) -> (row, col)
  Tensor cKV = make_identity_tensor(BlockShapeKV{});                  // (kBlockN, kHeadDim) -> (row, col)

  typename Traits::GmemTiledCopyO gmem_copy_O;
  auto gmem_thr_copy_O = gmem_copy_O.get_thread_slice(tid);
  Tensor tOgO = gmem_thr_copy_O.partition_D(gO);  // (CPY, CPY_M, CPY_K)
  Tensor tOcO = gmem_thr_copy_O.partition_D(cQ);  // (CPY, CPY_M, CPY_K)

  const int n_block_begin = mask.n_block_begin(m_block);
  const int n_block_end = mask.n_block_end(m_block);
  if (n_block_end <= n_block_begin) {
    // No row of this block sees a key: out = 0, lse = −inf.
    Tensor tOrO = make_fragment_like(tOgO);  // (CPY, CPY_M, CPY_K)
    clear(tOrO);
    copy_rows(gmem_copy_O, tOrO, tOgO, tOcO, rows_valid);
    for (int row = tid; row < kBlockM; row += Traits::kNThreads) {
      if (row < rows_valid) lse_rows[row] = -INFINITY;
    }
    return;
  }

  // Shared memory: Q | K | V; O reuses Q's bytes at the end.
  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)),
                          typename Traits::SmemLayoutQ{});                  // (kBlockM, kHeadDim)
  Tensor sK = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutKV{});  // (kBlockN, kHeadDim)
  Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});  // (kBlockN, kHeadDim)
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});           // (kHeadDim, kBlockN)
  Tensor sVtNoSwizzle = make_tensor(sV.data(), typename Traits::SmemLayoutVtNoSwizzle{});  // (kHeadDim, kBlockN)
  Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutO{});             // (kBlockM, kHeadDim)

  // Global -> shared partitions (cp.async, 16-byte vectors).
  typename Traits::GmemTiledCopyQKV gmem_copy_QKV;
  auto gmem_thr_copy_QKV = gmem_copy_QKV.get_thread_slice(tid);
  Tensor tQgQ = gmem_thr_copy_QKV.partition_S(gQ);     // (CPY, CPY_M, CPY_K)
  Tensor tQsQ = gmem_thr_copy_QKV.partition_D(sQ);     // (CPY, CPY_M, CPY_K)
  Tensor tQcQ = gmem_thr_copy_QKV.partition_S(cQ);     // (CPY, CPY_M, CPY_K)
  Tensor tKgK = gmem_thr_copy_QKV.partition_S(gK);     // (CPY, CPY_N, CPY_K, n_blocks)
  Tensor tKsK = gmem_thr_copy_QKV.partition_D(sK);     // (CPY, CPY_N, CPY_K)
  Tensor tVgV = gmem_thr_copy_QKV.partition_S(gV);     // (CPY, CPY_N, CPY_K, n_blocks)
  Tensor tVsV = gmem_thr_copy_QKV.partition_D(sV);     // (CPY, CPY_N, CPY_K)
  Tensor tKVcKV = gmem_thr_copy_QKV.partition_S(cKV);  // (CPY, CPY_N, CPY_K)

  // MMA partitions and their shared -> register copies (ldmatrix).
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);              // (MMA, MMA_M, MMA_K)
  Tensor tSrK = thr_mma.partition_fragment_B(sK);              // (MMA, MMA_N, MMA_K)
  Tensor tOrVt = thr_mma.partition_fragment_B(sVtNoSwizzle);   // (MMA, MMA_D, MMA_N)
  Tensor acc_o = partition_fragment_C(tiled_mma, BlockShapeQ{});  // (MMA, MMA_M, MMA_D)
  Tensor tScS = thr_mma.partition_C(make_identity_tensor(BlockShapeS{}));  // (MMA, MMA_M, MMA_N) -> (row, col)

  auto smem_copy_Q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_K = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_V = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  Tensor tSsQ = smem_copy_Q.get_thread_slice(tid).partition_S(sQ);    // (CPY, MMA_M, MMA_K)
  Tensor tSsK = smem_copy_K.get_thread_slice(tid).partition_S(sK);    // (CPY, MMA_N, MMA_K)
  Tensor tOsVt = smem_copy_V.get_thread_slice(tid).partition_S(sVt);  // (CPY, MMA_D, MMA_N)

  // Prologue: Q and the last key block in flight.
  int n_block = n_block_end - 1;
  copy_rows_or_zero(gmem_copy_QKV, tQgQ, tQsQ, tQcQ, rows_valid);
  copy_rows_or_zero(gmem_copy_QKV, tKgK(_, _, _, n_block), tKsK, tKVcKV,
                    seqlen_k - n_block * kBlockN);
  cp_async_fence();

  constexpr int kRowsPerThread = 2 * decltype(size<1>(acc_o))::value;
  OnlineSoftmax<kRowsPerThread> softmax(score_mod.score_scale() * float(M_LOG2E));
  clear(acc_o);
  Tensor acc_o_rowcol = rowcol_view(acc_o);  // (kRowsPerThread, head_dim cols)

  // One key block: S = Q·Kᵀ, mask (kMasked only), online softmax, O += P·V.
  auto process_key_block = [&](int n_block, auto masked) {
    Tensor acc_s = partition_fragment_C(tiled_mma, BlockShapeS{});  // (MMA, MMA_M, MMA_N)
    clear(acc_s);
    cp_async_wait<0>();
    __syncthreads();  // K[n] (and Q) landed; every warp is done reading V[n+1]
    if ((n_block + 1) * kBlockN <= seqlen_k) {
      copy(gmem_copy_QKV, tVgV(_, _, _, n_block), tVsV);
    } else {
      copy_rows_or_zero(gmem_copy_QKV, tVgV(_, _, _, n_block), tVsV, tKVcKV,
                        seqlen_k - n_block * kBlockN);
    }
    cp_async_fence();

    gemm_smem_smem(tiled_mma, acc_s, tSrQ, tSrK, tSsQ, tSsK, smem_copy_Q, smem_copy_K);
    score_mod.apply_softcap(acc_s);
    score_mod.apply_alibi(acc_s, tScS, m_block * kBlockM, n_block * kBlockN);
    if constexpr (decltype(masked)::value) {
      if (mask.needs_mask(m_block, n_block)) mask.apply(acc_s, tScS, m_block, n_block);
    }

    cp_async_wait<0>();
    __syncthreads();  // V[n] landed; every warp is done reading K[n]
    if (n_block > n_block_begin) {
      // Only the last key block can be partial, so no row guard here.
      copy(gmem_copy_QKV, tKgK(_, _, _, n_block - 1), tKsK);
      cp_async_fence();
    }

    Tensor scores = rowcol_view(acc_s);  // (kRowsPerThread, block cols)
    softmax.update(scores, acc_o_rowcol);
    Tensor rP = convert_fragment<Element>(acc_s);
    if constexpr (kScoreMod) {
      if (dropout.enabled()) {
        // After the row sums, which are of the undropped P; the kept ones'
        // 1 / (1 − p) is applied once, to O, in finalize. On the 16-bit P:
        // with the fp32 S dead the Philox rounds spill less (d128 scoremod:
        // 296–344 B of stack with the mask applied to S).
        dropout.zero_dropped(rP, dropout.keep_bits(tScS, m_block * kBlockM, n_block * kBlockN, head));
      }
    }
    Tensor tOrP = make_tensor(rP.data(), acc_to_operand_a_layout(rP.layout()));  // ((2,2,2), MMA_M, MMA_N/2)
    gemm_reg_smem(tiled_mma, acc_o, tOrP, tOrVt, tOsVt, smem_copy_V);
  };

  // Two loops: the first blocks visited may need the mask, the rest never
  // do, so the long loop carries no mask code. Measured on the H200 (bf16,
  // seqlen 16k, TFLOP/s, one loop -> two): d64 329 -> 337, causal 306 -> 338;
  // d128 353 -> 382, causal 317 -> 337 (benchmarks/NOTES.md).
  const int n_block_unmasked_end = n_block_end - mask.n_masked_blocks();
  if constexpr (kMask != MaskKind::kLocal) {
    for (; n_block >= 0 && n_block >= n_block_unmasked_end; --n_block) {
      process_key_block(n_block, cute::true_type{});
    }
    for (; n_block >= 0; --n_block) {
      process_key_block(n_block, cute::false_type{});
    }
  } else {
    // A window's left edge masks the first blocks (visited last) too. One
    // loop with both bodies: a third call site of the lambda was not inlined
    // (2.2 KB of stack, the accumulators in local memory).
    const int n_block_unmasked_begin = mask.n_block_left_unmasked_begin(m_block);
    for (; n_block >= n_block_begin; --n_block) {
      if (n_block >= n_block_unmasked_end || n_block < n_block_unmasked_begin) {
        process_key_block(n_block, cute::true_type{});
      } else {
        process_key_block(n_block, cute::false_type{});
      }
    }
  }

  // Epilogue: normalize (dropout's 1 / (1 − p) joins the row sums'
  // division), stage O through shared memory for 16-byte stores.
  auto lse = softmax.finalize(acc_o_rowcol, score_mod.score_scale(), dropout.keep_scale);  // (kRowsPerThread)
  Tensor rO = convert_fragment<Element>(acc_o);                      // (MMA, MMA_M, MMA_D)
  auto smem_copy_O = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma);
  auto smem_thr_copy_O = smem_copy_O.get_thread_slice(tid);
  Tensor taccOrO = smem_thr_copy_O.retile_S(rO);     // (CPY, CPY_M, CPY_D)
  Tensor taccOsO = smem_thr_copy_O.partition_D(sO);  // (CPY, CPY_M, CPY_D)
  __syncthreads();  // every warp is done reading sQ, whose bytes sO reuses
  copy(smem_copy_O, taccOrO, taccOsO);

  // The quad lane holding column 0 of a row writes that row's logsumexp.
  Tensor taccOcO = rowcol_view(thr_mma.partition_C(cQ));  // (kRowsPerThread, cols) -> (row, col)
  if (get<1>(taccOcO(0, 0)) == 0) {
    CUTE_UNROLL
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int row = get<0>(taccOcO(r, 0));
      if (row < rows_valid) lse_rows[row] = lse(r);
    }
  }

  __syncthreads();  // sO complete
  Tensor tOsO = gmem_thr_copy_O.partition_S(sO);  // (CPY, CPY_M, CPY_K)
  Tensor tOrO = make_fragment_like(tOgO);          // (CPY, CPY_M, CPY_K)
  copy(gmem_copy_O, tOsO, tOrO);
  copy_rows(gmem_copy_O, tOrO, tOgO, tOcO, rows_valid);
}

}  // namespace flashtile::sm80
