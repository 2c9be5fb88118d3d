// The small kernels around the backward's main kernel: rowsum(dO ∘ O) before
// it, and dQ's conversion from the fp32 accumulator after it.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "flashtile/params.hpp"

namespace flashtile::sm80 {

// dsum[b, h, i] = Σ_d dout[b, i, h, d] · out[b, i, h, d] in fp32: the D of
// dS = P ∘ (dP − D). One thread per (batch, row, head), 16-byte loads.
template <class Element, int kHeadDim>
__global__ void bwd_dot_do_o_kernel(const __grid_constant__ BwdParams params, float* dsum) {
  const int64_t rows = int64_t(params.batch) * params.seqlen_q * params.nheads;
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= rows) return;
  const int head = int(idx % params.nheads);
  const int64_t bi = idx / params.nheads;
  const int row = int(bi % params.seqlen_q);
  const int batch = int(bi / params.seqlen_q);
  const Element* o = static_cast<const Element*>(params.out) + batch * params.out_batch_stride +
                     row * params.out_row_stride + head * params.out_head_stride;
  const Element* d_o = static_cast<const Element*>(params.dout) + batch * params.dout_batch_stride +
                       row * params.dout_row_stride + head * params.dout_head_stride;
  constexpr int kVector = 16 / sizeof(Element);
  float sum = 0.f;
  CUTE_UNROLL
  for (int c = 0; c < kHeadDim; c += kVector) {
    cutlass::Array<Element, kVector> ov = *reinterpret_cast<const cutlass::Array<Element, kVector>*>(o + c);
    cutlass::Array<Element, kVector> dv = *reinterpret_cast<const cutlass::Array<Element, kVector>*>(d_o + c);
    CUTE_UNROLL
    for (int j = 0; j < kVector; ++j) sum += float(ov[j]) * float(dv[j]);
  }
  dsum[(int64_t(batch) * params.nheads + head) * params.seqlen_q + row] = sum;
}

// dq = dq_accum · softmax_scale, converted to the input dtype, written with
// dq's strides. dq_accum is contiguous (batch, seqlen_q, nheads, head_dim).
template <class Element, int kHeadDim>
__global__ void bwd_convert_dq_kernel(const __grid_constant__ BwdParams params,
                                      const float* dq_accum) {
  constexpr int kVector = 8;
  const int64_t vectors = int64_t(params.batch) * params.seqlen_q * params.nheads * kHeadDim / kVector;
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= vectors) return;
  const int64_t flat = idx * kVector;
  const int col = int(flat % kHeadDim);
  const int64_t r = flat / kHeadDim;
  const int head = int(r % params.nheads);
  const int64_t bi = r / params.nheads;
  const int row = int(bi % params.seqlen_q);
  const int batch = int(bi / params.seqlen_q);
  const float4* src = reinterpret_cast<const float4*>(dq_accum + flat);
  const float4 lo = src[0], hi = src[1];
  const float vals[kVector] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  cutlass::Array<Element, kVector> out;
  CUTE_UNROLL
  for (int j = 0; j < kVector; ++j) out[j] = Element(vals[j] * params.softmax_scale);
  Element* dst = static_cast<Element*>(params.dq) + batch * params.dq_batch_stride +
                 row * params.dq_row_stride + head * params.dq_head_stride + col;
  *reinterpret_cast<cutlass::Array<Element, kVector>*>(dst) = out;
}

}  // namespace flashtile::sm80
