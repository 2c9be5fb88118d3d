// The small kernels around both paths' backward main kernels: rowsum(dO ∘ O)
// before it, and after it dQ's conversion from the fp32 accumulator. (The
// SM80 main kernel's split tail has its own conversion,
// sm80/bwd_tail_split.hpp.)
#pragma once

#include <cuda_runtime_api.h>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <cstddef>
#include <cstdint>

#include "flashtile/common/bwd_tile.hpp"
#include "flashtile/common/gmem.hpp"
#include "flashtile/common/seqlen.hpp"
#include "flashtile/params.hpp"
#include "flashtile/workspace.hpp"

namespace flashtile {

using namespace cute;

// The rowsum kernel's launch shape: kDotThreads threads per CTA, each row
// shared by kDotThreadsPerRow of them: one per 16-byte vector of the row,
// rounded up to a power of two (so a row's threads sit in one warp; head
// dims 96 and 192 leave 4 and 8 of them idle).
constexpr int kDotThreads = 128;
constexpr int next_power_of_two(int n) { return n <= 1 ? 1 : 2 * next_power_of_two((n + 1) / 2); }
template <class Element, int kHeadDim>
constexpr int kDotThreadsPerRow = next_power_of_two(kHeadDim * int(sizeof(Element)) / 16);
template <class Element, int kHeadDim>
constexpr int kDotRowsPerCta = kDotThreads / kDotThreadsPerRow<Element, kHeadDim>;

// dsum[b, h, i] = Σ_d dout[b, i, h, d] · out[b, i, h, d] in fp32: the D of
// dS = P ∘ (dP − D). A varlen batch is launched as one sequence of total_q
// rows (run_bwd_with), whose (1, nheads, total_q) layout is varlen's. kVectors threads share a (batch, row, head) row, one
// 16-byte vector of out and dout each (or none), so a warp reads whole contiguous rows;
// a shuffle reduction sums them. Launch with kDotThreads threads per CTA and
// kDotRowsPerCta rows per CTA. The same threads also zero the dQ
// accumulator's zero_vectors 16-byte vectors (and the deterministic
// mode's dQ turn counters after it, where the launch asks), so its writes overlap these reads instead of costing a memset of its own.
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(kDotThreads)
    bwd_dot_do_o_kernel(const __grid_constant__ BwdParams params, float* dsum, float4* dq_accum,
                        int64_t zero_vectors) {
  constexpr int kElemsPerVector = 16 / sizeof(Element);
  constexpr int kVectors = kDotThreadsPerRow<Element, kHeadDim>;
  static_assert(kVectors <= 32 && 32 % kVectors == 0);
  static_assert(kDotRowsPerCta<Element, kHeadDim> * kVectors == kDotThreads);
  const int64_t rows = int64_t(params.batch) * params.seqlen_q * params.nheads;
  const int64_t idx = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kVectors;
  const int col = (threadIdx.x % kVectors) * kElemsPerVector;
  const int64_t threads = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < zero_vectors; i += threads) {
    dq_accum[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float sum = 0.f;
  if (idx < rows && col < kHeadDim) {
    const int head = int(idx % params.nheads);
    const int64_t bi = idx / params.nheads;
    const int row = int(bi % params.seqlen_q);
    const int batch = int(bi / params.seqlen_q);
    const Element* o = static_cast<const Element*>(params.out) + batch * params.out_batch_stride +
                       row * params.out_row_stride + head * params.out_head_stride + col;
    const Element* d_o = static_cast<const Element*>(params.dout) + batch * params.dout_batch_stride +
                         row * params.dout_row_stride + head * params.dout_head_stride + col;
    const auto ov = *reinterpret_cast<const cutlass::Array<Element, kElemsPerVector>*>(o);
    const auto dv = *reinterpret_cast<const cutlass::Array<Element, kElemsPerVector>*>(d_o);
    CUTE_UNROLL
    for (int j = 0; j < kElemsPerVector; ++j) sum += float(ov[j]) * float(dv[j]);
  }
  CUTE_UNROLL
  for (int offset = kVectors / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
  if (idx < rows && threadIdx.x % kVectors == 0) {
    const int head = int(idx % params.nheads);
    const int64_t bi = idx / params.nheads;
    dsum[(int64_t(bi / params.seqlen_q) * params.nheads + head) * params.seqlen_q + bi % params.seqlen_q] = sum;
  }
}

// dq = dq_accum · softmax_scale, converted to the input dtype, written with
// dq's strides. One CTA per (query block, head, batch) of the main kernel's
// Traits, a 1-D grid with the block index fastest. Each thread reads back the
// values it would hold in the dQ product (bwd_tile.hpp's dq_accum_offset,
// with the same dq_accum_vector); store_tile_staged writes them as 16-byte
// row segments.
template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads)
    bwd_convert_dq_kernel(const __grid_constant__ BwdParams params, const float* dq_accum) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kHeadDim = Traits::kHeadDim;
  using ShapeQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  const int m_blocks = ceil_div(params.seqlen_q, kBlockM);
  const int m_block = int(blockIdx.x) % m_blocks;
  const int head = int(blockIdx.x) / m_blocks % params.nheads;
  const int batch = int(blockIdx.x) / m_blocks / params.nheads;
  const int tid = threadIdx.x;
  const SeqInfo seq(params, batch);
  if (m_block * kBlockM >= seq.seqlen_q) return;  // varlen: past this sequence's rows
  const int rows_valid = seq.seqlen_q - m_block * kBlockM;
  const float* dq_block = dq_accum + (bwd_dq_accum_row(params, seq, head) + m_block * kBlockM) * kHeadDim;
  Tensor gdQ = local_tile(head_rows<kHeadDim>(static_cast<Element*>(params.dq),
                                              seq.q_offset(params.dq_batch_stride, params.dq_row_stride),
                                              params.dq_row_stride, params.dq_head_stride, head, seq.seqlen_q),
                          ShapeQ{}, make_coord(m_block, 0));  // (kBlockM, kHeadDim)
  __shared__ __align__(128) Element smem_dq[kBlockM * kHeadDim];
  Tensor sdQ = make_tensor(make_smem_ptr(smem_dq), typename Traits::SmemLayoutQ{});  // (kBlockM, kHeadDim)

  typename Traits::TiledMmadQ mma_dq;
  Tensor acc_dq = partition_fragment_C(mma_dq, ShapeQ{});  // (MMA, MMA_M, MMA_D)
  load_tile_accum<Traits::kNThreads>(acc_dq, dq_block, tid);
  store_tile_staged<Traits>(mma_dq, acc_dq, sdQ, gdQ, rows_valid, params.softmax_scale, tid);
}

// Launches the rowsum kernel: dsum = rowsum(dO ∘ O) into ws.dsum, and the
// first zero_bytes of ws.dq_accum (and what follows it) zeroed.
template <class Element, int kHeadDim>
cudaError_t launch_bwd_rowsum(const BwdParams& params, const BwdWorkspace& ws, size_t zero_bytes,
                              cudaStream_t stream) {
  const int64_t rows = bwd_query_rows(params) * params.nheads;
  constexpr int kRowsPerCta = kDotRowsPerCta<Element, kHeadDim>;
  // The rowsum kernel walks rows in the (batch, nheads, seqlen_q) layout of
  // lse and dsum; a varlen batch's (nheads, total_q) is that layout for one
  // sequence of total_q rows.
  BwdParams rows_params = params;
  if (is_varlen(params)) {
    rows_params.batch = 1;
    rows_params.seqlen_q = params.total_q;
    rows_params.cu_seqlens_q = nullptr;
  }
  bwd_dot_do_o_kernel<Element, kHeadDim><<<unsigned(ceil_div(rows, int64_t(kRowsPerCta))), kDotThreads, 0, stream>>>(
      rows_params, ws.dsum, reinterpret_cast<float4*>(ws.dq_accum), int64_t(zero_bytes / sizeof(float4)));
  return cudaPeekAtLastError();
}

}  // namespace flashtile
