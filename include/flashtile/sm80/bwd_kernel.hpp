// The FlashAttention-2 backward's main kernel on the SM80 path. One CTA owns
// one block of kBlockN keys of one K/V head and keeps dK and dV for it in
// registers; it walks every query head of that K/V head's group (GQA: the
// group's sum accumulates in place, no expanded buffers) and every query
// block that can see its keys (causal and windows skip the others):
//
//   load K, V once, and the first query block
//   for each query head of the group, each visible query block i:
//     start loading Q, dO, LSE, D of block i+1 (the other smem buffer;
//     with kSingleBufferDo, dO's one buffer is loaded after dV below)
//     S = Q_i·Kᵀ, dP = dO_i·Vᵀ                 (registers; V itself too
//                                               with BwdConfig::kVInRegs)
//     softcap and ALiBi (kScoreMod kernels, common/score_mod.hpp)
//     P = exp2(S·c − LSE·log2 e) (0 where masked), dS = P ∘ (dP − D_i);
//     with dropout's mask Z (kDropout kernels, common/dropout.hpp),
//     dS = P ∘ (dP ∘ Z/(1−p) − D_i) and P ∘ Z/(1−p) for dV
//     stage P and dS in shared memory (bf16/fp16)
//     dQ_i += dS·K  → fp32 atomic adds into the workspace
//                     (skipped in deterministic mode: bwd_dq_kernel.hpp)
//     dV += Pᵀ·dO_i, dK += dSᵀ·Q_i              (registers, all iterations)
//   write dK · scale and dV
//
// A CTA of a split tail (bwd_tail_split.hpp) runs a slice of its key block's
// iterations and adds its partial dK and dV into the workspace's tail
// accumulator instead.
//
// Two barriers per query block: one when its loads have landed (which also
// frees the other buffer and P/dS for reuse), one when P and dS are staged;
// with dO single-buffered (kSingleBufferDo) a third after the dV product.
// S and P never reach device memory; they are recomputed from Q, K and the
// forward's LSE.
#pragma once

#include <cute/tensor.hpp>

#include <type_traits>

#include "flashtile/common/bwd_schedule.hpp"
#include "flashtile/common/bwd_tile.hpp"
#include "flashtile/common/bwd_walk.hpp"
#include "flashtile/common/copy.hpp"
#include "flashtile/common/dropout.hpp"
#include "flashtile/common/fragment.hpp"
#include "flashtile/common/gmem.hpp"
#include "flashtile/common/mask.hpp"
#include "flashtile/common/score_mod.hpp"
#include "flashtile/common/seqlen.hpp"
#include "flashtile/params.hpp"
#include "flashtile/sm80/bwd_kernels_on_sm90.hpp"
#include "flashtile/sm80/bwd_tail_split.hpp"
#include "flashtile/sm80/gemm.hpp"
#include "flashtile/workspace.hpp"

namespace flashtile::sm80 {

using namespace cute;

// kScoreMod: softcap and ALiBi; kDropout (only with kScoreMod): dropout too.
// Dropout has kernels of its own because its code, even when off, made the
// softcap/ALiBi backward 7–10 % slower (benchmarks/NOTES.md, "Dropout").
// A compile for 9.0 builds only some of these kernels
// (sm80/bwd_kernels_on_sm90.hpp) and traps in the others.
template <class Traits, MaskKind kMask, bool kAccumulateDq, bool kScoreMod, bool kDropout, bool kVarlen>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    bwd_dkdv_kernel(const __grid_constant__ BwdParams params, float* dq_accum, const float* dsum,
                    const BwdTailSplit tail) {
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
    static_assert(kBwdDqAccumRowAlign % kBlockM == 0, "dQ accumulator rows are whole query blocks");
    static_assert(kScoreMod || !kDropout, "dropout runs in the modified kernels");
    // The kernels whose CTAs are all alike split their grid's tail; the
    // others ignore `tail` and carry none of its code.
    constexpr bool kCanSplit = kBwdTailSplittable<kMask, kScoreMod> && kAccumulateDq && !kVarlen;
    static_assert(kBlockN <= kBwdTailMaxBlockN, "a tail slot holds kBwdTailMaxBlockN keys");

    extern __shared__ __align__(128) char smem[];

    // The 1-D grid in bands of heads (common/bwd_schedule.hpp); in a split tail
    // several CTAs share a key block (bwd_tail_split.hpp).
    const int n_blocks = ceil_div(params.seqlen_k, kBlockN);
    const int group = params.nheads / params.nheads_k;
    const BwdTailPart split_part = kCanSplit ? BwdTailPart(tail, int(blockIdx.x)) : BwdTailPart(int(blockIdx.x));
    const BwdTileCoord tile = bwd_main_tile_coord(params, split_part.task, n_blocks, kHeadDim);
    const int n_block = tile.block_order;
    const int head_k = tile.head % params.nheads_k;
    const int batch = tile.head / params.nheads_k;
    const int tid = threadIdx.x;
    const SeqInfo seq(params, batch, std::bool_constant<kVarlen>{});
    const int seqlen_q = seq.seqlen_q;
    const int seqlen_k = seq.seqlen_k;
    if constexpr (kVarlen) {
      if (n_block * kBlockN >= seq.seqlen_k_rows) return;  // past this sequence's rows
    }
    const int kv_rows_valid = seqlen_k - n_block * kBlockN;               // keys attended
    const int kv_rows_out = seq.seqlen_k_rows - n_block * kBlockN;        // rows of dK, dV to write
    const BlockMask<kMask, kBlockM, kBlockN> mask(seqlen_q, seqlen_k, params.window_left, params.window_right);
    // ALiBi's slope is per query head: mod_of_head gives each head's.
    const ScoreMod<kScoreMod> score_mod(params.softmax_scale, params.softcap, seqlen_q, seqlen_k, 0.f);
    auto mod_of_head = [&](int head) {
      if constexpr (kScoreMod) {
        return score_mod.with_alibi_slope(alibi_slope(params, batch, head));
      } else {
        return score_mod;
      }
    };
    const float scale_log2 = score_mod.score_scale() * float(M_LOG2E);
    const Dropout<kDropout> dropout(params, batch);

    // This CTA's K and V tiles and its dK, dV outputs.
    auto [gK, gV, gdK, gdV] = key_block_tiles<kHeadDim, kBlockN, Element>(params, seq, head_k, n_block);
    if (kVarlen && kv_rows_valid <= 0) {
      store_zero_dkdv<Traits>(gdK, gdV, kv_rows_out, tid);
      return;
    }

    // Shared memory: Q[2] | dO[2] | K | V | P | dS | LSE[2] | D[2] (dO[1] with
    // kSingleBufferDo; no LSE and D with kRowsInRegs). The tensors below are
    // buffer 0's; buffer 1 of Q, dO, LSE and D sits one tile further.
    constexpr bool kSingleDo = Traits::kSingleBufferDo;
    constexpr int kDoBuffers = kSingleDo ? 1 : 2;
    Element* smem_q = reinterpret_cast<Element*>(smem);
    Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});             // (kBlockM, kHeadDim)
    Tensor sdO = make_tensor(sQ.data() + 2 * size(sQ), typename Traits::SmemLayoutQ{});         // (kBlockM, kHeadDim)
    Tensor sK = make_tensor(sdO.data() + kDoBuffers * size(sdO), typename Traits::SmemLayoutKV{});       // (kBlockN, kHeadDim)
    Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});             // (kBlockN, kHeadDim)
    Tensor sP = make_tensor(sV.data() + size(sV), typename Traits::SmemLayoutPdS{});            // (kBlockM, kBlockN)
    Tensor sdS = make_tensor(sP.data() + size(sP), typename Traits::SmemLayoutPdS{});           // (kBlockM, kBlockN)
    float* smem_lse = reinterpret_cast<float*>(smem + (2 + kDoBuffers) * Traits::kSmemQBytes + 2 * Traits::kSmemKVBytes +
                                               2 * Traits::kSmemPdSBytes);  // [2][kBlockM]
    float* smem_dsum = smem_lse + 2 * kBlockM;                              // [2][kBlockM]
    Tensor sQt = make_tensor(sQ.data(), typename Traits::SmemLayoutQt{});       // (kHeadDim, kBlockM)
    Tensor sdOt = make_tensor(sdO.data(), typename Traits::SmemLayoutQt{});     // (kHeadDim, kBlockM)
    Tensor sKt = make_tensor(sK.data(), typename Traits::SmemLayoutKt{});       // (kHeadDim, kBlockN)
    Tensor sPt = make_tensor(sP.data(), typename Traits::SmemLayoutPdSt{});     // (kBlockN, kBlockM)
    Tensor sdSt = make_tensor(sdS.data(), typename Traits::SmemLayoutPdSt{});   // (kBlockN, kBlockM)
    constexpr int kQBufferElems = kBlockM * kHeadDim;
    // A partition of buffer 0 of Q or dO, moved to buffer `buf`.
    auto in_buffer = [](auto const& buffer0, int buf) {
      return make_tensor(buffer0.data() + buf * kQBufferElems, buffer0.layout());
    };

    // Global -> shared copies.
    typename Traits::GmemTiledCopy gmem_copy;
    auto gmem_thr_copy = gmem_copy.get_thread_slice(tid);
    Tensor tKVcKV = gmem_thr_copy.partition_S(make_identity_tensor(ShapeKV{}));  // (CPY, CPY_N, CPY_K)
    Tensor tQcQ = gmem_thr_copy.partition_S(make_identity_tensor(ShapeQ{}));     // (CPY, CPY_M, CPY_K)
    Tensor tQsQ = gmem_thr_copy.partition_D(sQ);                                 // (CPY, CPY_M, CPY_K)
    Tensor tdOsdO = gmem_thr_copy.partition_D(sdO);                              // (CPY, CPY_M, CPY_K)

    // The (query head, query block) pairs that see this CTA's keys
    // (common/bwd_walk.hpp): iteration it -> query_block_of(it).
    const BwdQueryWalk<kMask, kBlockM, kBlockN> query_block_of(mask, n_block, head_k, group);
    const int masked_iterations = query_block_of.masked_iterations;
    // This CTA's iterations: all of them, or its part's slice in a split tail.
    const int it_begin = kCanSplit ? split_part.begin(query_block_of.iterations) : 0;
    const int it_end = kCanSplit ? split_part.end(query_block_of.iterations) : query_block_of.iterations;

    // The S/dP product's partition; the thread's (row, col) in its tile.
    typename Traits::TiledMmaSdP mma_sdp;
    auto thr_sdp = mma_sdp.get_thread_slice(tid);
    Tensor tScS = thr_sdp.partition_C(make_identity_tensor(ShapeS{}));  // (MMA, MMA_M, MMA_N) -> (row, col)
    // With BwdConfig::kRowsInRegs, a block's LSE and D rows come from global
    // memory straight into the registers of the threads that use them: issued
    // with the block's other loads into *_next, moved to *_rows when the block
    // starts. Otherwise they are staged in shared memory (smem_lse, smem_dsum).
    constexpr bool kRowsInRegs = Traits::kRowsInRegs;
    constexpr int kThreadRows = decltype(size<0>(rowcol_view(tScS)))::value;
    RowsInRegs<kThreadRows> lse_rows, dsum_rows, lse_next, dsum_next;

    // Issues the loads of iteration `it`'s dO (when with_do) and Q, LSE and D
    // (when with_q) into buffer `buf` (dO: its one buffer with kSingleBufferDo).
    auto load_query_block = [&](int it, int buf, bool with_q, bool with_do) {
      const auto [head, m_block] = query_block_of(it);
      const int q_rows_valid = seqlen_q - m_block * kBlockM;
      Tensor gQ = local_tile(head_rows<kHeadDim>(static_cast<const Element*>(params.q),
                                                 seq.q_offset(params.q_batch_stride, params.q_row_stride),
                                                 params.q_row_stride, params.q_head_stride, head, seqlen_q),
                             ShapeQ{}, make_coord(m_block, 0));  // (kBlockM, kHeadDim)
      Tensor gdO = local_tile(head_rows<kHeadDim>(static_cast<const Element*>(params.dout),
                                                  seq.q_offset(params.dout_batch_stride, params.dout_row_stride),
                                                  params.dout_row_stride, params.dout_head_stride, head, seqlen_q),
                              ShapeQ{}, make_coord(m_block, 0));  // (kBlockM, kHeadDim)
      if (with_q) {
        copy_rows_async_zfill<Element>(gmem_thr_copy.partition_S(gQ), in_buffer(tQsQ, buf), tQcQ, q_rows_valid);
      }
      if (with_do) {
        copy_rows_async_zfill<Element>(gmem_thr_copy.partition_S(gdO), in_buffer(tdOsdO, kSingleDo ? 0 : buf), tQcQ,
                                       q_rows_valid);
      }
      if (!with_q) return;
      const int64_t row_offset = seq.row_index(params, head) + m_block * kBlockM;
      if constexpr (kRowsInRegs) {
        // Rows past the sequence read 0, as the shared-memory rows' zero fill.
        Tensor rows = rowcol_view(tScS);  // (rows, cols) -> (row, col)
        CUTE_UNROLL
        for (int mi = 0; mi < kThreadRows; ++mi) {
          const int row = get<0>(rows(mi, 0));
          lse_next.values[mi] = row < q_rows_valid ? params.lse[row_offset + row] : 0.f;
          dsum_next.values[mi] = row < q_rows_valid ? dsum[row_offset + row] : 0.f;
        }
      } else {
        using RowCopy = typename Traits::RowCopyAtom;
        load_rows_async<kBlockM>(RowCopy{}, params.lse + row_offset, smem_lse + buf * kBlockM, q_rows_valid, tid);
        load_rows_async<kBlockM>(RowCopy{}, dsum + row_offset, smem_dsum + buf * kBlockM, q_rows_valid,
                                 tid - kBlockM);
      }
    };
    // Block `buf`'s LSE or D rows as recompute_p_and_ds reads them.
    auto block_rows = [&](RowsInRegs<kThreadRows> const& regs, const float* smem_rows, int buf) {
      if constexpr (kRowsInRegs) {
        return regs;
      } else {
        return RowsInSmem{smem_rows + buf * kBlockM};
      }
    };

    copy_rows_or_zero(gmem_copy, gmem_thr_copy.partition_S(gK), gmem_thr_copy.partition_D(sK), tKVcKV,
                      kv_rows_valid);
    copy_rows_or_zero(gmem_copy, gmem_thr_copy.partition_S(gV), gmem_thr_copy.partition_D(sV), tKVcKV,
                      kv_rows_valid);
    if (it_begin < it_end) load_query_block(it_begin, it_begin & 1, true, true);
    cp_async_fence();

    // The other two products' partitions.
    typename Traits::TiledMmadKV mma_dkv;
    typename Traits::TiledMmadQ mma_dq;
    auto thr_dkv = mma_dkv.get_thread_slice(tid);
    auto thr_dq = mma_dq.get_thread_slice(tid);

    Tensor tSrQ = thr_sdp.partition_fragment_A(sQ);     // (MMA, MMA_M, MMA_K)
    Tensor tSrK = thr_sdp.partition_fragment_B(sK);     // (MMA, MMA_N, MMA_K)
    Tensor tdPrdO = thr_sdp.partition_fragment_A(sdO);  // (MMA, MMA_M, MMA_K)
    Tensor tdPrV = thr_sdp.partition_fragment_B(sV);    // (MMA, MMA_N, MMA_K)
    Tensor tdVrPt = thr_dkv.partition_fragment_A(make_tensor(sP.data(), get_nonswizzle_portion(typename Traits::SmemLayoutPdSt{})));  // (MMA, MMA_N, MMA_M)
    Tensor tdVrdOt = thr_dkv.partition_fragment_B(make_tensor(sdO.data(), get_nonswizzle_portion(typename Traits::SmemLayoutQt{})));  // (MMA, MMA_D, MMA_M)
    Tensor tdKrdSt = thr_dkv.partition_fragment_A(make_tensor(sdS.data(), get_nonswizzle_portion(typename Traits::SmemLayoutPdSt{})));  // (MMA, MMA_N, MMA_M)
    Tensor tdKrQt = thr_dkv.partition_fragment_B(make_tensor(sQ.data(), get_nonswizzle_portion(typename Traits::SmemLayoutQt{})));  // (MMA, MMA_D, MMA_M)
    // dQ's product runs in column chunks of kDqChunk (all kHeadDim but in
    // tiles whose registers are short), each added to the accumulator before
    // the next: Kᵀ split into (kDqChunk, kBlockN, chunks, 1).
    constexpr int kDqChunk = Traits::kDqChunk;
    using ShapeKtChunk = Shape<Int<kDqChunk>, Int<kBlockN>>;
    Tensor sKt_chunks = flat_divide(sKt, ShapeKtChunk{});  // (kDqChunk, kBlockN, chunks, 1)
    Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);  // (MMA, MMA_M, MMA_N)
    Tensor tdQrKt = thr_dq.partition_fragment_B(flat_divide(make_tensor(sK.data(), get_nonswizzle_portion(typename Traits::SmemLayoutKt{})), ShapeKtChunk{})(_, _, 0, 0));  // (MMA, MMA_D, MMA_N) of one chunk

    auto ldsm_sdp_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_sdp);
    auto ldsm_sdp_b = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, mma_sdp);
    auto ldsm_dkv_a = make_tiled_copy_A(typename Traits::SmemCopyAtomTransposed{}, mma_dkv);
    auto ldsm_dkv_b = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma_dkv);
    auto ldsm_dq_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_dq);
    auto ldsm_dq_b = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma_dq);
    Tensor tSsQ = ldsm_sdp_a.get_thread_slice(tid).partition_S(sQ);       // (CPY, MMA_M, MMA_K)
    Tensor tdPsdO = ldsm_sdp_a.get_thread_slice(tid).partition_S(sdO);    // (CPY, MMA_M, MMA_K)
    Tensor tSsK = ldsm_sdp_b.get_thread_slice(tid).partition_S(sK);       // (CPY, MMA_N, MMA_K)
    Tensor tdPsV = ldsm_sdp_b.get_thread_slice(tid).partition_S(sV);      // (CPY, MMA_N, MMA_K)
    Tensor tdVsPt = ldsm_dkv_a.get_thread_slice(tid).partition_S(sPt);    // (CPY, MMA_N, MMA_M)
    Tensor tdKsdSt = ldsm_dkv_a.get_thread_slice(tid).partition_S(sdSt);  // (CPY, MMA_N, MMA_M)
    Tensor tdVsdOt = ldsm_dkv_b.get_thread_slice(tid).partition_S(sdOt);  // (CPY, MMA_D, MMA_M)
    Tensor tdKsQt = ldsm_dkv_b.get_thread_slice(tid).partition_S(sQt);    // (CPY, MMA_D, MMA_M)
    Tensor tdQsdS = ldsm_dq_a.get_thread_slice(tid).partition_S(sdS);     // (CPY, MMA_M, MMA_N)
    Tensor tdQsKt = ldsm_dq_b.get_thread_slice(tid).partition_S(sKt_chunks);  // (CPY, MMA_D, MMA_N, chunks, 1)

    auto copy_PdS = make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, mma_sdp);
    auto thr_copy_PdS = copy_PdS.get_thread_slice(tid);
    Tensor tPsP = thr_copy_PdS.partition_D(sP);      // (CPY, CPY_M, CPY_N)
    Tensor tdSsdS = thr_copy_PdS.partition_D(sdS);   // (CPY, CPY_M, CPY_N)

    Tensor acc_dk = partition_fragment_C(mma_dkv, ShapeKV{});  // (MMA, MMA_N, MMA_D)
    Tensor acc_dv = partition_fragment_C(mma_dkv, ShapeKV{});  // (MMA, MMA_N, MMA_D)
    clear(acc_dk);
    clear(acc_dv);

    // One query block: its five products, dQ's atomic adds; the mask when
    // `masked` (a std::bool_constant).
    auto process_query_block = [&](int it, auto masked) {
      const int buf = it & 1;
      const auto [head, m_block] = query_block_of(it);
      cp_async_wait<0>();
      // Block `it` has landed; every warp has finished block it−1, so the
      // other buffer, P and dS are free.
      __syncthreads();
      if constexpr (kRowsInRegs) {  // before the next block's loads overwrite *_next
        lse_rows = lse_next;
        dsum_rows = dsum_next;
      }
      if (it + 1 < it_end) load_query_block(it + 1, buf ^ 1, true, !kSingleDo);
      cp_async_fence();
      const int do_buf = kSingleDo ? 0 : buf;

      Tensor acc_s = partition_fragment_C(mma_sdp, ShapeS{});   // (MMA, MMA_M, MMA_N)
      Tensor acc_dp = partition_fragment_C(mma_sdp, ShapeS{});  // (MMA, MMA_M, MMA_N)
      clear(acc_s);
      clear(acc_dp);
      gemm_smem_smem(mma_sdp, acc_s, tSrQ, tSrK, in_buffer(tSsQ, buf), tSsK, ldsm_sdp_a, ldsm_sdp_b);
      if constexpr (Traits::kVInRegs) {
        gemm_smem_reg(mma_sdp, acc_dp, tdPrdO, tdPrV, in_buffer(tdPsdO, do_buf), ldsm_sdp_a);
      } else {
        gemm_smem_smem(mma_sdp, acc_dp, tdPrdO, tdPrV, in_buffer(tdPsdO, do_buf), tdPsV, ldsm_sdp_a, ldsm_sdp_b);
      }

      score_mod.apply_softcap(acc_s);
      if constexpr (decltype(masked)::value) mask.apply(acc_s, tScS, m_block, n_block);
      // Dropout code only in the kDropout kernels (common/dropout.hpp says why).
      if constexpr (kDropout) {
        recompute_p_and_ds(acc_s, acc_dp, tScS, block_rows(lse_rows, smem_lse, buf),
                           block_rows(dsum_rows, smem_dsum, buf), scale_log2, mod_of_head(head), m_block * kBlockM,
                           n_block * kBlockN, seqlen_q - m_block * kBlockM,
                           dropout.keep_bits_or_all(tScS, m_block * kBlockM, n_block * kBlockN, head),
                           dropout.keep_scale);
      } else {
        recompute_p_and_ds(acc_s, acc_dp, tScS, block_rows(lse_rows, smem_lse, buf),
                           block_rows(dsum_rows, smem_dsum, buf), scale_log2, mod_of_head(head), m_block * kBlockM,
                           n_block * kBlockN, seqlen_q - m_block * kBlockM);
      }
      copy(copy_PdS, thr_copy_PdS.retile_S(convert_fragment<Element>(acc_s)), tPsP);
      copy(copy_PdS, thr_copy_PdS.retile_S(convert_fragment<Element>(acc_dp)), tdSsdS);
      __syncthreads();  // P and dS staged
      if constexpr (kSingleDo) {
        // dV first: once every warp is past it, dO's one buffer takes the next
        // block's, whose load then overlaps the dQ and dK products.
        gemm_smem_smem(mma_dkv, acc_dv, tdVrPt, tdVrdOt, tdVsPt, tdVsdOt, ldsm_dkv_a, ldsm_dkv_b);
        __syncthreads();
        if (it + 1 < it_end) load_query_block(it + 1, 0, false, true);
        cp_async_fence();
      }

      // dQ before dV and dK (before dK alone with kSingleBufferDo): its atomic
      // adds then drain while those products run (1–5 % faster than after
      // them, measured on the H200).
      if constexpr (kAccumulateDq) {
        // This query block's slice of the accumulator (bwd_dq_accum_rows:
        // seqlen_q rounded up to whole blocks). Rows past seqlen_q add zeros
        // there (their dS is 0), so no row guard is needed.
        float* dq_block = dq_accum + (bwd_dq_accum_row(params, seq, head) + m_block * kBlockM) * kHeadDim;
        CUTE_UNROLL
        for (int c = 0; c < kHeadDim / kDqChunk; ++c) {
          Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kDqChunk>>{});  // (MMA, MMA_M, MMA_D)
          clear(acc_dq);
          gemm_smem_smem(mma_dq, acc_dq, tdQrdS, tdQrKt, tdQsdS, tdQsKt(_, _, _, c, 0), ldsm_dq_a, ldsm_dq_b);
          // The whole tile's fragment is (MMA, MMA_M, MMA_D) with MMA_D
          // outermost, so chunk c is its c-th run of size(acc_dq) values in
          // the accumulator's register order (dq_accum_offset).
          add_tile_atomic<Traits::kNThreads>(dq_block + c * int(size(acc_dq)) * Traits::kNThreads, acc_dq, tid);
        }
      }

      if constexpr (!kSingleDo) {
        gemm_smem_smem(mma_dkv, acc_dv, tdVrPt, tdVrdOt, tdVsPt, in_buffer(tdVsdOt, buf), ldsm_dkv_a, ldsm_dkv_b);
      }
      gemm_smem_smem(mma_dkv, acc_dk, tdKrdSt, tdKrQt, tdKsdSt, in_buffer(tdKsQt, buf), ldsm_dkv_a, ldsm_dkv_b);
    };
    if constexpr (Traits::kVInRegs) {
      // K, V and the first query block have landed (the loop's first wait
      // would wait for them too); V's fragment is read once, here.
      cp_async_wait<0>();
      __syncthreads();
      copy(ldsm_sdp_b, tdPsV, ldsm_sdp_b.get_thread_slice(tid).retile_D(tdPrV));
    }
    int it = it_begin;
    if constexpr (kScoreMod) {
      // One body for every block, the mask applied throughout: with a second
      // body for the unmasked blocks ptxas stops inlining them (3.6–4.3 KB of
      // stack, the accumulators in local memory; d64, d128, d256 with
      // dropout, and d64 with softcap/ALiBi alone). The mask costs a few
      // compares per score next to the modifiers' work.
      for (; it < it_end; ++it) process_query_block(it, std::true_type{});
    } else {
      // (Unsplit, it_end is all iterations and masked_iterations never more;
      // the min stays out of those kernels' code.)
      const int masked_end = kCanSplit ? min(masked_iterations, it_end) : masked_iterations;
      for (; it < masked_end; ++it) process_query_block(it, std::true_type{});
      for (; it < it_end; ++it) process_query_block(it, std::false_type{});
    }

    cp_async_wait<0>();  // no copy left in flight on any path (the loop waited on the last one)
    if constexpr (kCanSplit) {
      if (split_part.parts > 1) {  // a slice of a split key block: add, the convert kernel scales and writes
        float* slot = tail.slot<kBlockN, kHeadDim>(split_part.task);
        add_tile_atomic<Traits::kNThreads>(slot, acc_dk, tid);
        add_tile_atomic<Traits::kNThreads>(slot + kBlockN * kHeadDim, acc_dv, tid);
        return;
      }
    }
    // dK = scale · Σ dSᵀ·Q; dV = Σ Pᵀ·dO, staged in sK and sV once every warp
    // is past the last products that read them.
    __syncthreads();
    store_tile_staged<Traits>(mma_dkv, acc_dk, sK, gdK, kv_rows_out, params.softmax_scale, tid);
    store_tile_staged<Traits>(mma_dkv, acc_dv, sV, gdV, kv_rows_out, 1.f, tid);
  }
}

}  // namespace flashtile::sm80
