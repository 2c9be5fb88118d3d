// The FlashAttention-2 backward's main kernel on the SM80 path. One CTA owns
// one block of kBlockN keys of one K/V head and keeps dK and dV for it in
// registers; it walks every query head of that K/V head's group (GQA: the
// group's sum accumulates in place, no expanded buffers) and every query
// block that can see its keys:
//
//   load K, V once
//   for each query head of the group, each visible query block i:
//     load Q_i, dO_i, LSE_i, D_i
//     S = Q_i·Kᵀ, dP = dO_i·Vᵀ                 (registers)
//     P = exp2(S·c − LSE·log2 e) (0 where masked), dS = P ∘ (dP − D_i)
//     stage P and dS in shared memory (bf16/fp16)
//     dV += Pᵀ·dO_i, dK += dSᵀ·Q_i              (registers, all iterations)
//     dQ_i += dS·K  → fp32 atomic adds into the workspace
//   write dK · scale and dV
//
// S and P never reach device memory; they are recomputed from Q, K and the
// forward's LSE.
#pragma once

#include <cute/tensor.hpp>

#include "flashtile/common/fragment.hpp"
#include "flashtile/params.hpp"
#include "flashtile/sm80/copy.hpp"
#include "flashtile/sm80/gemm.hpp"

namespace flashtile::sm80 {

using namespace cute;

// Writes the rows below rows_valid of a register accumulator, scaled and
// converted, to global memory. coords: the same partition of an identity
// tensor; out: the (rows, kHeadDim) global tile.
template <class Element, class Acc, class Coords, class Out>
CUTE_DEVICE void store_rows(Acc const& acc, Coords const& coords, Out&& out, int rows_valid,
                            float scale) {
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) {
    // Accumulator values come in column pairs: one 32-bit store each.
    const int row = get<0>(coords(i));
    if (row < rows_valid) {
      cutlass::Array<Element, 2> pair;
      pair[0] = Element(acc(i) * scale);
      pair[1] = Element(acc(i + 1) * scale);
      *reinterpret_cast<cutlass::Array<Element, 2>*>(&out(row, get<1>(coords(i)))) = pair;
    }
  }
}

template <class Traits, bool kIsCausal>
__global__ void __launch_bounds__(Traits::kNThreads)
    bwd_dkdv_kernel(const __grid_constant__ BwdParams params, float* dq_accum, const float* dsum) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  using ShapeQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using ShapeKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using ShapeS = Shape<Int<kBlockM>, Int<kBlockN>>;
  static_assert(Traits::kNThreads >= kBlockM, "one thread per row loads LSE and D");

  extern __shared__ __align__(128) char smem[];

  const int n_block = blockIdx.x;
  const int head_k = blockIdx.y;
  const int batch = blockIdx.z;
  const int tid = threadIdx.x;
  const int group = params.nheads / params.nheads_k;
  const int kv_rows_valid = params.seqlen_k - n_block * kBlockN;
  const float scale_log2 = params.softmax_scale * float(M_LOG2E);

  // This CTA's K and V tiles and its dK, dV outputs.
  Tensor gK = local_tile(make_tensor(make_gmem_ptr(static_cast<const Element*>(params.k) +
                                                   batch * params.k_batch_stride + head_k * params.k_head_stride),
                                     make_shape(params.seqlen_k, Int<kHeadDim>{}),
                                     make_stride(params.k_row_stride, _1{})),
                         ShapeKV{}, make_coord(n_block, 0));  // (kBlockN, kHeadDim)
  Tensor gV = local_tile(make_tensor(make_gmem_ptr(static_cast<const Element*>(params.v) +
                                                   batch * params.v_batch_stride + head_k * params.v_head_stride),
                                     make_shape(params.seqlen_k, Int<kHeadDim>{}),
                                     make_stride(params.v_row_stride, _1{})),
                         ShapeKV{}, make_coord(n_block, 0));  // (kBlockN, kHeadDim)
  Tensor gdK = local_tile(make_tensor(make_gmem_ptr(static_cast<Element*>(params.dk) +
                                                    batch * params.dk_batch_stride + head_k * params.dk_head_stride),
                                      make_shape(params.seqlen_k, Int<kHeadDim>{}),
                                      make_stride(params.dk_row_stride, _1{})),
                          ShapeKV{}, make_coord(n_block, 0));  // (kBlockN, kHeadDim)
  Tensor gdV = local_tile(make_tensor(make_gmem_ptr(static_cast<Element*>(params.dv) +
                                                    batch * params.dv_batch_stride + head_k * params.dv_head_stride),
                                      make_shape(params.seqlen_k, Int<kHeadDim>{}),
                                      make_stride(params.dv_row_stride, _1{})),
                          ShapeKV{}, make_coord(n_block, 0));  // (kBlockN, kHeadDim)

  // Shared memory: Q | dO | K | V | P | dS | LSE | D, and transposed views.
  Element* smem_q = reinterpret_cast<Element*>(smem);
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});             // (kBlockM, kHeadDim)
  Tensor sdO = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutQ{});             // (kBlockM, kHeadDim)
  Tensor sK = make_tensor(sdO.data() + size(sdO), typename Traits::SmemLayoutKV{});           // (kBlockN, kHeadDim)
  Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});             // (kBlockN, kHeadDim)
  Tensor sP = make_tensor(sV.data() + size(sV), typename Traits::SmemLayoutPdS{});            // (kBlockM, kBlockN)
  Tensor sdS = make_tensor(sP.data() + size(sP), typename Traits::SmemLayoutPdS{});           // (kBlockM, kBlockN)
  float* smem_lse = reinterpret_cast<float*>(smem + 2 * Traits::kSmemQBytes + 2 * Traits::kSmemKVBytes +
                                             2 * Traits::kSmemPdSBytes);
  float* smem_dsum = smem_lse + kBlockM;
  Tensor sQt = make_tensor(sQ.data(), typename Traits::SmemLayoutQt{});       // (kHeadDim, kBlockM)
  Tensor sdOt = make_tensor(sdO.data(), typename Traits::SmemLayoutQt{});     // (kHeadDim, kBlockM)
  Tensor sKt = make_tensor(sK.data(), typename Traits::SmemLayoutKt{});       // (kHeadDim, kBlockN)
  Tensor sPt = make_tensor(sP.data(), typename Traits::SmemLayoutPdSt{});     // (kBlockN, kBlockM)
  Tensor sdSt = make_tensor(sdS.data(), typename Traits::SmemLayoutPdSt{});   // (kBlockN, kBlockM)

  // Global -> shared copies.
  typename Traits::GmemTiledCopy gmem_copy;
  auto gmem_thr_copy = gmem_copy.get_thread_slice(tid);
  Tensor tKVcKV = gmem_thr_copy.partition_S(make_identity_tensor(ShapeKV{}));  // (CPY, CPY_N, CPY_K)
  Tensor tQcQ = gmem_thr_copy.partition_S(make_identity_tensor(ShapeQ{}));     // (CPY, CPY_M, CPY_K)
  Tensor tQsQ = gmem_thr_copy.partition_D(sQ);                                 // (CPY, CPY_M, CPY_K)
  Tensor tdOsdO = gmem_thr_copy.partition_D(sdO);                              // (CPY, CPY_M, CPY_K)

  copy_rows_or_zero(gmem_copy, gmem_thr_copy.partition_S(gK), gmem_thr_copy.partition_D(sK), tKVcKV,
                    kv_rows_valid);
  copy_rows_or_zero(gmem_copy, gmem_thr_copy.partition_S(gV), gmem_thr_copy.partition_D(sV), tKVcKV,
                    kv_rows_valid);
  cp_async_fence();

  // The three products' partitions.
  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadKV mma_dkv;
  typename Traits::TiledMmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
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
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);  // (MMA, MMA_M, MMA_N)
  Tensor tdQrKt = thr_dq.partition_fragment_B(make_tensor(sK.data(), get_nonswizzle_portion(typename Traits::SmemLayoutKt{})));  // (MMA, MMA_D, MMA_N)

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
  Tensor tdQsKt = ldsm_dq_b.get_thread_slice(tid).partition_S(sKt);     // (CPY, MMA_D, MMA_N)

  auto copy_PdS = make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, mma_sdp);
  auto thr_copy_PdS = copy_PdS.get_thread_slice(tid);
  Tensor tPsP = thr_copy_PdS.partition_D(sP);      // (CPY, CPY_M, CPY_N)
  Tensor tdSsdS = thr_copy_PdS.partition_D(sdS);   // (CPY, CPY_M, CPY_N)

  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(ShapeS{}));               // (MMA, MMA_M, MMA_N) -> (row, col)
  Tensor tdQcdQ = thr_dq.partition_C(make_identity_tensor(ShapeQ{}));              // (MMA, MMA_M, MMA_D) -> (row, col)
  Tensor tdKVcdKV = thr_dkv.partition_C(make_identity_tensor(ShapeKV{}));          // (MMA, MMA_N, MMA_D) -> (row, col)

  Tensor acc_dk = partition_fragment_C(mma_dkv, ShapeKV{});  // (MMA, MMA_N, MMA_D)
  Tensor acc_dv = partition_fragment_C(mma_dkv, ShapeKV{});  // (MMA, MMA_N, MMA_D)
  clear(acc_dk);
  clear(acc_dv);

  // Query blocks that see any of this CTA's keys: query row i sees key j
  // iff j <= i + seqlen_k - seqlen_q (causal, bottom-right aligned).
  const int m_block_end = ceil_div(params.seqlen_q, kBlockM);
  int m_block_begin = 0;
  if constexpr (kIsCausal) {
    const int first_row = n_block * kBlockN - (params.seqlen_k - params.seqlen_q);
    m_block_begin = first_row > 0 ? first_row / kBlockM : 0;
  }

  for (int head = head_k * group; head < (head_k + 1) * group; ++head) {
    Tensor mQ = make_tensor(make_gmem_ptr(static_cast<const Element*>(params.q) +
                                          batch * params.q_batch_stride + head * params.q_head_stride),
                            make_shape(params.seqlen_q, Int<kHeadDim>{}),
                            make_stride(params.q_row_stride, _1{}));  // (seqlen_q, kHeadDim)
    Tensor mdO = make_tensor(make_gmem_ptr(static_cast<const Element*>(params.dout) +
                                           batch * params.dout_batch_stride + head * params.dout_head_stride),
                             make_shape(params.seqlen_q, Int<kHeadDim>{}),
                             make_stride(params.dout_row_stride, _1{}));  // (seqlen_q, kHeadDim)
    const int64_t row_offset = (int64_t(batch) * params.nheads + head) * params.seqlen_q;
    const float* lse_rows = params.lse + row_offset;
    const float* dsum_rows = dsum + row_offset;
    // dq_accum is contiguous (batch, seqlen_q, nheads, head_dim).
    Tensor mdQaccum = make_tensor(make_gmem_ptr(dq_accum + (int64_t(batch) * params.seqlen_q * params.nheads + head) * kHeadDim),
                                  make_shape(params.seqlen_q, Int<kHeadDim>{}),
                                  make_stride(int64_t(params.nheads) * kHeadDim, _1{}));  // (seqlen_q, kHeadDim)

    for (int m_block = m_block_begin; m_block < m_block_end; ++m_block) {
      const int q_rows_valid = params.seqlen_q - m_block * kBlockM;
      copy_rows_or_zero(gmem_copy, gmem_thr_copy.partition_S(local_tile(mQ, ShapeQ{}, make_coord(m_block, 0))),
                        tQsQ, tQcQ, q_rows_valid);
      copy_rows_or_zero(gmem_copy, gmem_thr_copy.partition_S(local_tile(mdO, ShapeQ{}, make_coord(m_block, 0))),
                        tdOsdO, tQcQ, q_rows_valid);
      cp_async_fence();
      if (tid < kBlockM) {
        // log2-domain LSE; +inf (P = 0) for rows past seqlen_q and for rows
        // that saw no key in the forward (lse = −inf, every key masked).
        const int row = m_block * kBlockM + tid;
        const float lse = row < params.seqlen_q ? lse_rows[row] : -INFINITY;
        smem_lse[tid] = lse == -INFINITY ? INFINITY : lse * float(M_LOG2E);
        smem_dsum[tid] = row < params.seqlen_q ? dsum_rows[row] : 0.f;
      }
      cp_async_wait<0>();
      __syncthreads();

      Tensor acc_s = partition_fragment_C(mma_sdp, ShapeS{});   // (MMA, MMA_M, MMA_N)
      Tensor acc_dp = partition_fragment_C(mma_sdp, ShapeS{});  // (MMA, MMA_M, MMA_N)
      clear(acc_s);
      clear(acc_dp);
      gemm_smem_smem(mma_sdp, acc_s, tSrQ, tSrK, tSsQ, tSsK, ldsm_sdp_a, ldsm_sdp_b);
      gemm_smem_smem(mma_sdp, acc_dp, tdPrdO, tdPrV, tdPsdO, tdPsV, ldsm_sdp_a, ldsm_sdp_b);

      // P = exp2(S·c − LSE) where visible, else 0; dS = P ∘ (dP − D).
      const int row0 = m_block * kBlockM;
      const int col0 = n_block * kBlockN;
      CUTE_UNROLL
      for (int i = 0; i < size(acc_s); ++i) {
        const int r = get<0>(tScS(i));
        const int col = col0 + get<1>(tScS(i));
        bool visible = col < params.seqlen_k;
        if constexpr (kIsCausal) visible = visible && col <= row0 + r + params.seqlen_k - params.seqlen_q;
        const float p = visible ? fast_exp2(acc_s(i) * scale_log2 - smem_lse[r]) : 0.f;
        acc_s(i) = p;
        acc_dp(i) = p * (acc_dp(i) - smem_dsum[r]);
      }
      Tensor rP = convert_fragment<Element>(acc_s);
      Tensor rdS = convert_fragment<Element>(acc_dp);
      copy(copy_PdS, thr_copy_PdS.retile_S(rP), tPsP);
      copy(copy_PdS, thr_copy_PdS.retile_S(rdS), tdSsdS);
      __syncthreads();  // P and dS complete

      gemm_smem_smem(mma_dkv, acc_dv, tdVrPt, tdVrdOt, tdVsPt, tdVsdOt, ldsm_dkv_a, ldsm_dkv_b);
      gemm_smem_smem(mma_dkv, acc_dk, tdKrdSt, tdKrQt, tdKsdSt, tdKsQt, ldsm_dkv_a, ldsm_dkv_b);

      Tensor acc_dq = partition_fragment_C(mma_dq, ShapeQ{});  // (MMA, MMA_M, MMA_D)
      clear(acc_dq);
      gemm_smem_smem(mma_dq, acc_dq, tdQrdS, tdQrKt, tdQsdS, tdQsKt, ldsm_dq_a, ldsm_dq_b);
      Tensor gdQaccum = local_tile(mdQaccum, ShapeQ{}, make_coord(m_block, 0));  // (kBlockM, kHeadDim)
      CUTE_UNROLL
      for (int i = 0; i < size(acc_dq); ++i) {
        const int r = get<0>(tdQcdQ(i));
        if (r < q_rows_valid) atomicAdd(&gdQaccum(r, get<1>(tdQcdQ(i))), acc_dq(i));
      }
      __syncthreads();  // every warp is done with sQ, sdO, sP, sdS
    }
  }

  // dK = scale · Σ dSᵀ·Q; dV = Σ Pᵀ·dO.
  store_rows<Element>(acc_dk, tdKVcdKV, gdK, kv_rows_valid, params.softmax_scale);
  store_rows<Element>(acc_dv, tdKVcdKV, gdV, kv_rows_valid, 1.f);
}

}  // namespace flashtile::sm80
