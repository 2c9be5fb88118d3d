// The deterministic mode's dQ kernel on the SM80 path. The main kernel
// (bwd_kernel.hpp) then computes only dK and dV; here one CTA owns one query
// block of one query head, keeps its dQ in registers and walks the key blocks
// in order, so dQ is summed in a fixed order with no atomics:
//
//   load Q, dO, LSE, D once, and the first K, V block
//   for each visible key block j:
//     start loading K, V of block j+1 (the other smem buffer)
//     S = Q·K_jᵀ, dP = dO·V_jᵀ, P, dS = P ∘ (dP − D)   (as the main kernel)
//     stage dS in shared memory
//     dQ += dS·K_j                                       (registers)
//   write dQ · scale
//
// It recomputes S and dP, which the main kernel also computes: the price of
// determinism is those two products and dS·K again, measured in
// benchmarks/NOTES.md.
#pragma once

#include <cute/tensor.hpp>

#include "flashtile/common/bwd_schedule.hpp"
#include "flashtile/common/bwd_tile.hpp"
#include "flashtile/common/copy.hpp"
#include "flashtile/common/dropout.hpp"
#include "flashtile/common/fragment.hpp"
#include "flashtile/common/gmem.hpp"
#include "flashtile/common/mask.hpp"
#include "flashtile/common/score_mod.hpp"
#include "flashtile/common/seqlen.hpp"
#include "flashtile/params.hpp"
#include "flashtile/sm80/bwd_kernels_on_sm90.hpp"
#include "flashtile/sm80/gemm.hpp"

namespace flashtile::sm80 {

using namespace cute;

// A compile for 9.0 builds only some of these kernels
// (sm80/bwd_kernels_on_sm90.hpp) and traps in the others.
template <class Traits, MaskKind kMask, bool kScoreMod, bool kDropout>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    bwd_dq_kernel(const __grid_constant__ BwdParams params, const float* dsum) {
  if constexpr (!bwd_kernel_built_here<kScoreMod, kDropout>()) {
    __trap();
  } else {
    using Element = typename Traits::Element;
    constexpr int kBlockM = Traits::kBlockM;
    constexpr int kBlockN = Traits::kBlockN;
    constexpr int kHeadDim = Traits::kHeadDim;
    using ShapeQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
    using ShapeKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
    using ShapeS = Shape<Int<kBlockM>, Int<kBlockN>>;
    static_assert(Traits::kNThreads >= 2 * kBlockM, "one thread per row loads LSE, another D");

    extern __shared__ __align__(128) char smem[];

    // The 1-D grid in bands of heads (common/bwd_schedule.hpp). A CTA streams its
    // head's K and V. Causal: the last query blocks see the most keys, so they
    // are each head's block order 0.
    const int m_blocks = ceil_div(params.seqlen_q, kBlockM);
    const BwdTileCoord tile = bwd_tile_coord(int(blockIdx.x), m_blocks, params.nheads * params.batch,
                                             int64_t(params.seqlen_k) * kHeadDim * (2 + 2));
    const int m_block = kMask == MaskKind::kCausal ? m_blocks - 1 - tile.block_order : tile.block_order;
    const int head = tile.head % params.nheads;
    const int batch = tile.head / params.nheads;
    const int tid = threadIdx.x;
    const int head_k = head / (params.nheads / params.nheads_k);
    const SeqInfo seq(params, batch);
    const int seqlen_q = seq.seqlen_q;
    const int seqlen_k = seq.seqlen_k;
    if (m_block * kBlockM >= seqlen_q) return;  // varlen: past this sequence's rows
    const int q_rows_valid = seqlen_q - m_block * kBlockM;
    const ScoreMod<kScoreMod> score_mod(params.softmax_scale, params.softcap, seqlen_q, seqlen_k,
                                        kScoreMod ? alibi_slope(params, batch, head) : 0.f);
    const float scale_log2 = score_mod.score_scale() * float(M_LOG2E);
    static_assert(kScoreMod || !kDropout, "dropout runs in the modified kernels");
    const Dropout<kDropout> dropout(params, batch);
    const BlockMask<kMask, kBlockM, kBlockN> mask(seqlen_q, seqlen_k, params.window_left, params.window_right);

    Tensor gQ = local_tile(head_rows<kHeadDim>(static_cast<const Element*>(params.q),
                                               seq.q_offset(params.q_batch_stride, params.q_row_stride),
                                               params.q_row_stride, params.q_head_stride, head, seqlen_q),
                           ShapeQ{}, make_coord(m_block, 0));  // (kBlockM, kHeadDim)
    Tensor gdO = local_tile(head_rows<kHeadDim>(static_cast<const Element*>(params.dout),
                                                seq.q_offset(params.dout_batch_stride, params.dout_row_stride),
                                                params.dout_row_stride, params.dout_head_stride, head, seqlen_q),
                            ShapeQ{}, make_coord(m_block, 0));  // (kBlockM, kHeadDim)
    Tensor gdQ = local_tile(head_rows<kHeadDim>(static_cast<Element*>(params.dq),
                                                seq.q_offset(params.dq_batch_stride, params.dq_row_stride),
                                                params.dq_row_stride, params.dq_head_stride, head, seqlen_q),
                            ShapeQ{}, make_coord(m_block, 0));  // (kBlockM, kHeadDim)
    // K and V of this (batch, K/V head), each (seqlen_k, kHeadDim).
    Tensor mK = head_rows<kHeadDim>(static_cast<const Element*>(params.k),
                                    seq.k_offset(params.k_batch_stride, params.k_row_stride),
                                    params.k_row_stride, params.k_head_stride, head_k, seqlen_k);
    Tensor mV = head_rows<kHeadDim>(static_cast<const Element*>(params.v),
                                    seq.k_offset(params.v_batch_stride, params.v_row_stride),
                                    params.v_row_stride, params.v_head_stride, head_k, seqlen_k);

    // Shared memory: Q | dO | K[2] | V[2] | dS | LSE | D. sK and sV are buffer
    // 0's; buffer 1 sits one tile further.
    Element* smem_q = reinterpret_cast<Element*>(smem);
    Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});          // (kBlockM, kHeadDim)
    Tensor sdO = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutQ{});          // (kBlockM, kHeadDim)
    Tensor sK = make_tensor(sdO.data() + size(sdO), typename Traits::SmemLayoutKV{});        // (kBlockN, kHeadDim)
    Tensor sV = make_tensor(sK.data() + 2 * size(sK), typename Traits::SmemLayoutKV{});      // (kBlockN, kHeadDim)
    Tensor sdS = make_tensor(sV.data() + 2 * size(sV), typename Traits::SmemLayoutPdS{});    // (kBlockM, kBlockN)
    float* smem_lse = reinterpret_cast<float*>(smem + 2 * Traits::kSmemQBytes + 4 * Traits::kSmemKVBytes +
                                               Traits::kSmemPdSBytes);  // [kBlockM]
    float* smem_dsum = smem_lse + kBlockM;                              // [kBlockM]
    Tensor sKt = make_tensor(sK.data(), typename Traits::SmemLayoutKt{});  // (kHeadDim, kBlockN)
    constexpr int kKVBufferElems = kBlockN * kHeadDim;
    // A partition of buffer 0 of K or V, moved to buffer `buf`.
    auto in_buffer = [](auto const& buffer0, int buf) {
      return make_tensor(buffer0.data() + buf * kKVBufferElems, buffer0.layout());
    };

    typename Traits::GmemTiledCopy gmem_copy;
    auto gmem_thr_copy = gmem_copy.get_thread_slice(tid);
    Tensor tQcQ = gmem_thr_copy.partition_S(make_identity_tensor(ShapeQ{}));     // (CPY, CPY_M, CPY_K)
    Tensor tKVcKV = gmem_thr_copy.partition_S(make_identity_tensor(ShapeKV{}));  // (CPY, CPY_N, CPY_K)
    Tensor tKsK = gmem_thr_copy.partition_D(sK);                                 // (CPY, CPY_N, CPY_K)
    Tensor tVsV = gmem_thr_copy.partition_D(sV);                                 // (CPY, CPY_N, CPY_K)
    auto load_key_block = [&](int n_block, int buf) {
      const int kv_rows_valid = seqlen_k - n_block * kBlockN;
      copy_rows_or_zero(gmem_copy, gmem_thr_copy.partition_S(local_tile(mK, ShapeKV{}, make_coord(n_block, 0))),
                        in_buffer(tKsK, buf), tKVcKV, kv_rows_valid);
      copy_rows_or_zero(gmem_copy, gmem_thr_copy.partition_S(local_tile(mV, ShapeKV{}, make_coord(n_block, 0))),
                        in_buffer(tVsV, buf), tKVcKV, kv_rows_valid);
    };

    const int n_block_begin = mask.n_block_begin(m_block);
    const int n_block_end = mask.n_block_end(m_block);  // <= n_block_begin: no row of this block sees a key
    copy_rows_or_zero(gmem_copy, gmem_thr_copy.partition_S(gQ), gmem_thr_copy.partition_D(sQ), tQcQ, q_rows_valid);
    copy_rows_or_zero(gmem_copy, gmem_thr_copy.partition_S(gdO), gmem_thr_copy.partition_D(sdO), tQcQ, q_rows_valid);
    const int64_t row_offset = seq.row_index(params, head) + m_block * kBlockM;
    using RowCopy = typename Traits::RowCopyAtom;
    load_rows_async<kBlockM>(RowCopy{}, params.lse + row_offset, smem_lse, q_rows_valid, tid);
    load_rows_async<kBlockM>(RowCopy{}, dsum + row_offset, smem_dsum, q_rows_valid, tid - kBlockM);
    if (n_block_end > n_block_begin) load_key_block(n_block_begin, 0);
    cp_async_fence();

    typename Traits::TiledMmaSdP mma_sdp;
    typename Traits::TiledMmadQ mma_dq;
    auto thr_sdp = mma_sdp.get_thread_slice(tid);
    auto thr_dq = mma_dq.get_thread_slice(tid);
    Tensor tSrQ = thr_sdp.partition_fragment_A(sQ);     // (MMA, MMA_M, MMA_K)
    Tensor tSrK = thr_sdp.partition_fragment_B(sK);     // (MMA, MMA_N, MMA_K)
    Tensor tdPrdO = thr_sdp.partition_fragment_A(sdO);  // (MMA, MMA_M, MMA_K)
    Tensor tdPrV = thr_sdp.partition_fragment_B(sV);    // (MMA, MMA_N, MMA_K)
    Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);   // (MMA, MMA_M, MMA_N)
    Tensor tdQrKt = thr_dq.partition_fragment_B(make_tensor(sK.data(), get_nonswizzle_portion(typename Traits::SmemLayoutKt{})));  // (MMA, MMA_D, MMA_N)

    auto ldsm_sdp_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_sdp);
    auto ldsm_sdp_b = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, mma_sdp);
    auto ldsm_dq_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_dq);
    auto ldsm_dq_b = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma_dq);
    Tensor tSsQ = ldsm_sdp_a.get_thread_slice(tid).partition_S(sQ);     // (CPY, MMA_M, MMA_K)
    Tensor tdPsdO = ldsm_sdp_a.get_thread_slice(tid).partition_S(sdO);  // (CPY, MMA_M, MMA_K)
    Tensor tSsK = ldsm_sdp_b.get_thread_slice(tid).partition_S(sK);     // (CPY, MMA_N, MMA_K)
    Tensor tdPsV = ldsm_sdp_b.get_thread_slice(tid).partition_S(sV);    // (CPY, MMA_N, MMA_K)
    Tensor tdQsdS = ldsm_dq_a.get_thread_slice(tid).partition_S(sdS);   // (CPY, MMA_M, MMA_N)
    Tensor tdQsKt = ldsm_dq_b.get_thread_slice(tid).partition_S(sKt);   // (CPY, MMA_D, MMA_N)

    auto copy_dS = make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, mma_sdp);
    auto thr_copy_dS = copy_dS.get_thread_slice(tid);
    Tensor tdSsdS = thr_copy_dS.partition_D(sdS);  // (CPY, CPY_M, CPY_N)

    Tensor tScS = thr_sdp.partition_C(make_identity_tensor(ShapeS{}));   // (MMA, MMA_M, MMA_N) -> (row, col)

    Tensor acc_dq = partition_fragment_C(mma_dq, ShapeQ{});  // (MMA, MMA_M, MMA_D)
    clear(acc_dq);

    for (int n_block = n_block_begin; n_block < n_block_end; ++n_block) {
      const int buf = (n_block - n_block_begin) & 1;
      cp_async_wait<0>();
      // Key block n_block has landed; every warp has finished the previous
      // one, so the other buffer and dS are free.
      __syncthreads();
      if (n_block + 1 < n_block_end) load_key_block(n_block + 1, buf ^ 1);
      cp_async_fence();

      Tensor acc_s = partition_fragment_C(mma_sdp, ShapeS{});   // (MMA, MMA_M, MMA_N)
      Tensor acc_dp = partition_fragment_C(mma_sdp, ShapeS{});  // (MMA, MMA_M, MMA_N)
      clear(acc_s);
      clear(acc_dp);
      gemm_smem_smem(mma_sdp, acc_s, tSrQ, tSrK, tSsQ, in_buffer(tSsK, buf), ldsm_sdp_a, ldsm_sdp_b);
      gemm_smem_smem(mma_sdp, acc_dp, tdPrdO, tdPrV, tdPsdO, in_buffer(tdPsV, buf), ldsm_sdp_a, ldsm_sdp_b);
      score_mod.apply_softcap(acc_s);
      if (mask.needs_mask(m_block, n_block)) mask.apply(acc_s, tScS, m_block, n_block);
      if constexpr (kDropout) {  // with dropout's mask: the main kernel's dS (bwd_kernel.hpp)
        recompute_p_and_ds(acc_s, acc_dp, tScS, RowsInSmem{smem_lse}, RowsInSmem{smem_dsum}, scale_log2, score_mod,
                           m_block * kBlockM, n_block * kBlockN, q_rows_valid,
                           dropout.keep_bits_or_all(tScS, m_block * kBlockM, n_block * kBlockN, head),
                           dropout.keep_scale);
      } else {
        recompute_p_and_ds(acc_s, acc_dp, tScS, RowsInSmem{smem_lse}, RowsInSmem{smem_dsum}, scale_log2, score_mod,
                           m_block * kBlockM, n_block * kBlockN, q_rows_valid);
      }
      copy(copy_dS, thr_copy_dS.retile_S(convert_fragment<Element>(acc_dp)), tdSsdS);
      __syncthreads();  // dS staged

      gemm_smem_smem(mma_dq, acc_dq, tdQrdS, tdQrKt, tdQsdS, in_buffer(tdQsKt, buf), ldsm_dq_a, ldsm_dq_b);
    }

    cp_async_wait<0>();  // with no key block to visit, the Q block's loads are still in flight
    __syncthreads();      // every warp is past the last product that reads sQ, the stage
    store_tile_staged<Traits>(mma_dq, acc_dq, sQ, gdQ, q_rows_valid, params.softmax_scale, tid);
  }
}

}  // namespace flashtile::sm80
