// The backward's main kernel on the SM90 path: the SM80 kernel's CTA, walk
// and per-block steps (sm80/bwd_kernel.hpp describes them), with the five
// products on wgmma (sm90/bwd_traits.hpp). Per query block:
//
//   wait for its Q, dO, LSE, D; start loading the next block's
//   S = Q·Kᵀ, dP = dO·Vᵀ                       (issued together)
//   P, dS recomputed in registers, staged in shared memory
//   dQ = dS·K, dV += Pᵀ·dO, dK += dSᵀ·Q        (issued together)
//   dQ's atomic adds, while dV and dK run
//
// Plain attention only (no softcap, ALiBi or dropout: those run the SM80
// kernels).
#pragma once

#include <cute/tensor.hpp>

#include <type_traits>

#include "flashtile/common/bwd_schedule.hpp"
#include "flashtile/common/bwd_tile.hpp"
#include "flashtile/common/bwd_walk.hpp"
#include "flashtile/common/copy.hpp"
#include "flashtile/common/fragment.hpp"
#include "flashtile/common/gmem.hpp"
#include "flashtile/common/mask.hpp"
#include "flashtile/common/score_mod.hpp"
#include "flashtile/common/seqlen.hpp"
#include "flashtile/params.hpp"
#include "flashtile/sm90/gemm.hpp"
#include "flashtile/workspace.hpp"

namespace flashtile::sm90 {

using namespace cute;

template <class Traits, MaskKind kMask, bool kAccumulateDq, bool kVarlen>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    bwd_dkdv_kernel(const __grid_constant__ BwdParams params, float* dq_accum, const float* dsum) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  using ShapeQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using ShapeKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using ShapeS = Shape<Int<kBlockM>, Int<kBlockN>>;
  static_assert(Traits::kNThreads >= 2 * kBlockM, "one thread per row loads LSE, another D");
  static_assert(kBwdDqAccumRowAlign % kBlockM == 0, "dQ accumulator rows are whole query blocks");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  // wgmma exists on sm90a only; sm90::run_bwd launches this kernel nowhere else.
  __trap();
#else
  extern __shared__ __align__(128) char smem[];

  const int n_blocks = ceil_div(params.seqlen_k, kBlockN);
  const int group = params.nheads / params.nheads_k;
  const BwdTileCoord tile = bwd_main_tile_coord(params, int(blockIdx.x), n_blocks, kHeadDim);
  const int n_block = tile.block_order;
  const int head_k = tile.head % params.nheads_k;
  const int batch = tile.head / params.nheads_k;
  const int tid = threadIdx.x;
  const SeqInfo seq(params, batch, std::bool_constant<kVarlen>{});
  const int seqlen_q = seq.seqlen_q;
  const int seqlen_k = seq.seqlen_k;
  if constexpr (kVarlen) {
    if (n_block * kBlockN >= seq.seqlen_k_rows) return;
  }
  const int kv_rows_valid = seqlen_k - n_block * kBlockN;
  const int kv_rows_out = seq.seqlen_k_rows - n_block * kBlockN;
  const BlockMask<kMask, kBlockM, kBlockN> mask(seqlen_q, seqlen_k, params.window_left, params.window_right);
  const ScoreMod<false> score_mod(params.softmax_scale, params.softcap, seqlen_q, seqlen_k, 0.f);
  const float scale_log2 = score_mod.score_scale() * float(M_LOG2E);

  // This CTA's K and V tiles and its dK, dV outputs.
  auto [gK, gV, gdK, gdV] = key_block_tiles<kHeadDim, kBlockN, Element>(params, seq, head_k, n_block);
  if (kVarlen && kv_rows_valid <= 0) {
    store_zero_dkdv<Traits>(gdK, gdV, kv_rows_out, tid);
    return;
  }

  // Shared memory: Q[2] | dO[2] | K | V | P | dS | LSE[2] | D[2].
  Element* smem_q = reinterpret_cast<Element*>(smem);
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});      // (kBlockM, kHeadDim)
  Tensor sdO = make_tensor(sQ.data() + 2 * size(sQ), typename Traits::SmemLayoutQ{});  // (kBlockM, kHeadDim)
  Tensor sK = make_tensor(sdO.data() + 2 * size(sdO), typename Traits::SmemLayoutKV{}); // (kBlockN, kHeadDim)
  Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});      // (kBlockN, kHeadDim)
  Tensor sP = make_tensor(sV.data() + size(sV), typename Traits::SmemLayoutPdS{});     // (kBlockM, kBlockN)
  Tensor sdS = make_tensor(sP.data() + size(sP), typename Traits::SmemLayoutPdS{});    // (kBlockM, kBlockN)
  float* smem_lse = reinterpret_cast<float*>(smem + 4 * Traits::kSmemQBytes + 2 * Traits::kSmemKVBytes +
                                             2 * Traits::kSmemPdSBytes);  // [2][kBlockM]
  float* smem_dsum = smem_lse + 2 * kBlockM;                              // [2][kBlockM]
  Tensor sQt = make_tensor(sQ.data(), typename Traits::SmemLayoutQt{});      // (kHeadDim, kBlockM)
  Tensor sdOt = make_tensor(sdO.data(), typename Traits::SmemLayoutQt{});    // (kHeadDim, kBlockM)
  Tensor sKt = make_tensor(sK.data(), typename Traits::SmemLayoutKt{});      // (kHeadDim, kBlockN)
  Tensor sPt = make_tensor(sP.data(), typename Traits::SmemLayoutPdSt{});    // (kBlockN, kBlockM)
  Tensor sdSt = make_tensor(sdS.data(), typename Traits::SmemLayoutPdSt{});  // (kBlockN, kBlockM)
  constexpr int kQBufferElems = kBlockM * kHeadDim;
  // A tensor on buffer 0 of Q or dO, moved to buffer `buf`.
  auto in_buffer = [](auto const& buffer0, int buf) {
    return make_tensor(buffer0.data() + buf * kQBufferElems, buffer0.layout());
  };

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
  const int iterations = query_block_of.iterations;

  auto load_query_block = [&](int it, int buf) {
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
    copy_rows_async_zfill<Element>(gmem_thr_copy.partition_S(gQ), in_buffer(tQsQ, buf), tQcQ, q_rows_valid);
    copy_rows_async_zfill<Element>(gmem_thr_copy.partition_S(gdO), in_buffer(tdOsdO, buf), tQcQ, q_rows_valid);
    const int64_t row_offset = seq.row_index(params, head) + m_block * kBlockM;
    using RowCopy = typename Traits::RowCopyAtom;
    load_rows_async<kBlockM>(RowCopy{}, params.lse + row_offset, smem_lse + buf * kBlockM, q_rows_valid, tid);
    load_rows_async<kBlockM>(RowCopy{}, dsum + row_offset, smem_dsum + buf * kBlockM, q_rows_valid,
                                   tid - kBlockM);
  };

  copy_rows_or_zero(gmem_copy, gmem_thr_copy.partition_S(gK), gmem_thr_copy.partition_D(sK), tKVcKV,
                          kv_rows_valid);
  copy_rows_or_zero(gmem_copy, gmem_thr_copy.partition_S(gV), gmem_thr_copy.partition_D(sV), tKVcKV,
                          kv_rows_valid);
  if (iterations > 0) load_query_block(0, 0);
  cp_async_fence();

  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadKV mma_dkv;
  typename Traits::TiledMmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(ShapeS{}));  // (MMA, MMA_M, MMA_N) -> (row, col)

  // Descriptors of the operands that do not change with the query block ...
  Tensor tSrK = thr_sdp.partition_fragment_B(sK);     // (MMA, MMA_N, MMA_K)
  Tensor tdPrV = thr_sdp.partition_fragment_B(sV);    // (MMA, MMA_N, MMA_K)
  Tensor tdVrPt = thr_dkv.partition_fragment_A(sPt);  // (MMA, MMA_N, MMA_M)
  Tensor tdKrdSt = thr_dkv.partition_fragment_A(sdSt);  // (MMA, MMA_N, MMA_M)
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);   // (MMA, MMA_M, MMA_N)
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);   // (MMA, MMA_D, MMA_N)

  auto copy_PdS = make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, mma_sdp);
  auto thr_copy_PdS = copy_PdS.get_thread_slice(tid);
  Tensor tPsP = thr_copy_PdS.partition_D(sP);     // (CPY, CPY_M, CPY_N)
  Tensor tdSsdS = thr_copy_PdS.partition_D(sdS);  // (CPY, CPY_M, CPY_N)

  Tensor acc_dk = partition_fragment_C(mma_dkv, ShapeKV{});  // (MMA, MMA_N, MMA_D)
  Tensor acc_dv = partition_fragment_C(mma_dkv, ShapeKV{});  // (MMA, MMA_N, MMA_D)
  clear(acc_dk);
  clear(acc_dv);

  auto process_query_block = [&](int it, auto masked) {
    const int buf = it & 1;
    const auto [head, m_block] = query_block_of(it);
    cp_async_wait<0>();
    fence_smem_for_wgmma();
    // Block `it` has landed; every warpgroup has retired block it−1's
    // products, so the other buffer, P and dS are free.
    __syncthreads();
    if (it + 1 < iterations) load_query_block(it + 1, buf ^ 1);
    cp_async_fence();

    // ... and of those that do (Q and dO's buffer).
    Tensor tSrQ = thr_sdp.partition_fragment_A(in_buffer(sQ, buf));     // (MMA, MMA_M, MMA_K)
    Tensor tdPrdO = thr_sdp.partition_fragment_A(in_buffer(sdO, buf));  // (MMA, MMA_M, MMA_K)
    Tensor tdVrdOt = thr_dkv.partition_fragment_B(in_buffer(sdOt, buf));  // (MMA, MMA_D, MMA_M)
    Tensor tdKrQt = thr_dkv.partition_fragment_B(in_buffer(sQt, buf));    // (MMA, MMA_D, MMA_M)

    Tensor acc_s = partition_fragment_C(mma_sdp, ShapeS{});   // (MMA, MMA_M, MMA_N)
    Tensor acc_dp = partition_fragment_C(mma_sdp, ShapeS{});  // (MMA, MMA_M, MMA_N)
    gemm_async<true>(mma_sdp, tSrQ, tSrK, acc_s);
    gemm_async<true>(mma_sdp, tdPrdO, tdPrV, acc_dp);
    warpgroup_wait<0>();

    if constexpr (decltype(masked)::value) mask.apply(acc_s, tScS, m_block, n_block);
    recompute_p_and_ds(acc_s, acc_dp, tScS, RowsInSmem{smem_lse + buf * kBlockM},
                             RowsInSmem{smem_dsum + buf * kBlockM}, scale_log2, score_mod, m_block * kBlockM,
                             n_block * kBlockN, seqlen_q - m_block * kBlockM);
    copy(copy_PdS, thr_copy_PdS.retile_S(convert_fragment<Element>(acc_s)), tPsP);
    copy(copy_PdS, thr_copy_PdS.retile_S(convert_fragment<Element>(acc_dp)), tdSsdS);
    fence_smem_for_wgmma();
    __syncthreads();  // P and dS staged

    if constexpr (kAccumulateDq) {
      Tensor acc_dq = partition_fragment_C(mma_dq, ShapeQ{});  // (MMA, MMA_M, MMA_D)
      gemm_async<true>(mma_dq, tdQrdS, tdQrKt, acc_dq);
      gemm_async<false>(mma_dkv, tdVrPt, tdVrdOt, acc_dv);
      gemm_async<false>(mma_dkv, tdKrdSt, tdKrQt, acc_dk);
      warpgroup_wait<2>();  // dQ's product done; dV's and dK's run on
      float* dq_block = dq_accum + (bwd_dq_accum_row(params, seq, head) + m_block * kBlockM) * kHeadDim;
      constexpr int kVector = dq_accum_vector();
      static_assert(decltype(size(acc_dq))::value % kVector == 0);
      CUTE_UNROLL
      for (int i = 0; i < size(acc_dq); i += kVector) {
        atomic_add_vector<kVector>(dq_block + dq_accum_offset<Traits::kNThreads, kVector>(tid, i), acc_dq,
                                         i);
      }
    } else {
      gemm_async<false>(mma_dkv, tdVrPt, tdVrdOt, acc_dv);
      gemm_async<false>(mma_dkv, tdKrdSt, tdKrQt, acc_dk);
    }
    warpgroup_wait<0>();
  };
  int it = 0;
  for (; it < masked_iterations; ++it) process_query_block(it, std::true_type{});
  for (; it < iterations; ++it) process_query_block(it, std::false_type{});

  cp_async_wait<0>();
  __syncthreads();
  store_tile_staged<Traits>(mma_dkv, acc_dk, sK, gdK, kv_rows_out, params.softmax_scale, tid);
  store_tile_staged<Traits>(mma_dkv, acc_dv, sV, gdV, kv_rows_out, 1.f, tid);
#endif
}

}  // namespace flashtile::sm90
