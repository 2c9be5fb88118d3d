// The examples' test harness: random bf16 inputs, a naive fp32 reference
// attention kernel, and check(), which runs one problem through a launcher
// and compares out and lse with the reference.
#pragma once

#include <cuda_runtime.h>
#include <cutlass/numeric_types.h>

#include <flashtile/flashtile.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

using Element = cutlass::bfloat16_t;
constexpr int kHeadDim = 128;

#define CUDA_CHECK(call)                                                          \
  do {                                                                            \
    cudaError_t err_ = (call);                                                    \
    if (err_ != cudaSuccess) {                                                    \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(2);                                                               \
    }                                                                             \
  } while (0)

// Values uniform in [-1.7, 1.7) (unit variance) from a hash of the index.
__global__ void fill_random(Element* x, int64_t n, uint64_t seed) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  uint64_t h = (uint64_t(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 29;
  x[i] = Element((float(h & 0xFFFFFF) / float(1 << 24) - 0.5f) * 3.46f);
}

// One thread per (batch, head, query row): softmax(q·kᵀ·scale)·v in fp32, with
// the same bottom-right causal alignment, contiguous (b, s, h, d) tensors.
// Causal with prefix_len > 0 is a prefix-LM: the first prefix_len keys are
// visible to every query as well.
__global__ void reference_attention(const Element* q, const Element* k, const Element* v,
                                    float* out, float* lse, int batch, int seqlen_q,
                                    int seqlen_k, int nheads, int nheads_k, float scale,
                                    bool causal, int prefix_len) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  const int head = blockIdx.y, b = blockIdx.z;
  if (row >= seqlen_q) return;
  const int head_k = head / (nheads / nheads_k);
  const Element* q_row = q + ((int64_t(b) * seqlen_q + row) * nheads + head) * kHeadDim;
  auto key = [&](const Element* t, int j) {
    return t + ((int64_t(b) * seqlen_k + j) * nheads_k + head_k) * kHeadDim;
  };
  const int last = causal ? min(seqlen_k - 1, row + seqlen_k - seqlen_q) : seqlen_k - 1;
  auto visible = [&](int j) { return j <= last || j < prefix_len; };
  float max_score = -INFINITY;
  for (int j = 0; j < seqlen_k; ++j) {
    if (!visible(j)) continue;
    float s = 0.f;
    for (int d = 0; d < kHeadDim; ++d) s += float(q_row[d]) * float(key(k, j)[d]);
    max_score = fmaxf(max_score, s * scale);
  }
  float acc[kHeadDim] = {};
  float sum = 0.f;
  for (int j = 0; j < seqlen_k; ++j) {
    if (!visible(j)) continue;
    float s = 0.f;
    for (int d = 0; d < kHeadDim; ++d) s += float(q_row[d]) * float(key(k, j)[d]);
    const float p = expf(s * scale - max_score);
    sum += p;
    for (int d = 0; d < kHeadDim; ++d) acc[d] += p * float(key(v, j)[d]);
  }
  float* out_row = out + ((int64_t(b) * seqlen_q + row) * nheads + head) * kHeadDim;
  for (int d = 0; d < kHeadDim; ++d) out_row[d] = sum > 0.f ? acc[d] / sum : 0.f;
  lse[(int64_t(b) * nheads + head) * seqlen_q + row] = sum > 0.f ? max_score + logf(sum) : -INFINITY;
}

struct Problem {
  int batch, seqlen_q, seqlen_k, nheads, nheads_k;
  bool causal;
  int prefix_len = 0;  // with causal: the reference's prefix-LM (the launcher applies it)
};

// Runs one problem through `run` (a launcher taking FwdParams) and the
// reference; returns true if out and lse agree within bf16 tolerances.
template <class Run>
bool check(const Problem& pb, Run run) {
  const int64_t nq = int64_t(pb.batch) * pb.seqlen_q * pb.nheads * kHeadDim;
  const int64_t nk = int64_t(pb.batch) * pb.seqlen_k * pb.nheads_k * kHeadDim;
  const int64_t nlse = int64_t(pb.batch) * pb.nheads * pb.seqlen_q;
  Element *q, *k, *v, *out;
  float *lse, *ref_out, *ref_lse;
  CUDA_CHECK(cudaMalloc(&q, nq * sizeof(Element)));
  CUDA_CHECK(cudaMalloc(&k, nk * sizeof(Element)));
  CUDA_CHECK(cudaMalloc(&v, nk * sizeof(Element)));
  CUDA_CHECK(cudaMalloc(&out, nq * sizeof(Element)));
  CUDA_CHECK(cudaMalloc(&lse, nlse * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&ref_out, nq * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&ref_lse, nlse * sizeof(float)));
  fill_random<<<(nq + 255) / 256, 256>>>(q, nq, 1);
  fill_random<<<(nk + 255) / 256, 256>>>(k, nk, 2);
  fill_random<<<(nk + 255) / 256, 256>>>(v, nk, 3);
  CUDA_CHECK(cudaMemset(out, 0xff, nq * sizeof(Element)));  // NaN: catches unwritten rows
  CUDA_CHECK(cudaMemset(lse, 0xff, nlse * sizeof(float)));

  flashtile::FwdParams p;  // contiguous (batch, seqlen, nheads, head_dim)
  p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
  p.batch = pb.batch, p.seqlen_q = pb.seqlen_q, p.seqlen_k = pb.seqlen_k;
  p.nheads = pb.nheads, p.nheads_k = pb.nheads_k, p.head_dim = kHeadDim;
  p.q_row_stride = p.out_row_stride = int64_t(pb.nheads) * kHeadDim;
  p.q_head_stride = p.out_head_stride = kHeadDim;
  p.q_batch_stride = p.out_batch_stride = p.q_row_stride * pb.seqlen_q;
  p.k_row_stride = p.v_row_stride = int64_t(pb.nheads_k) * kHeadDim;
  p.k_head_stride = p.v_head_stride = kHeadDim;
  p.k_batch_stride = p.v_batch_stride = p.k_row_stride * pb.seqlen_k;
  p.softmax_scale = 1.f / std::sqrt(float(kHeadDim));
  p.causal = pb.causal;
  p.dtype = flashtile::DType::kBf16;

  const flashtile::Status status = run(p);
  if (status != flashtile::Status::kSuccess) {
    std::printf("flashtile failed: %s\n", flashtile::status_string(status));
    return false;
  }
  const dim3 ref_grid((pb.seqlen_q + 63) / 64, pb.nheads, pb.batch);
  reference_attention<<<ref_grid, 64>>>(q, k, v, ref_out, ref_lse, pb.batch, pb.seqlen_q,
                                        pb.seqlen_k, pb.nheads, pb.nheads_k, p.softmax_scale,
                                        pb.causal, pb.prefix_len);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<Element> h_out(nq);
  std::vector<float> h_lse(nlse), h_ref_out(nq), h_ref_lse(nlse);
  CUDA_CHECK(cudaMemcpy(h_out.data(), out, nq * sizeof(Element), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(h_lse.data(), lse, nlse * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(h_ref_out.data(), ref_out, nq * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(h_ref_lse.data(), ref_lse, nlse * sizeof(float), cudaMemcpyDeviceToHost));
  double out_err = 0.0, lse_err = 0.0;
  bool finite = true;
  for (int64_t i = 0; i < nq; ++i) {
    const float x = float(h_out[i]);
    finite &= std::isfinite(x);
    out_err = std::fmax(out_err, std::fabs(x - h_ref_out[i]));
  }
  for (int64_t i = 0; i < nlse; ++i) {
    if (std::isinf(h_ref_lse[i])) {
      finite &= h_lse[i] == h_ref_lse[i];  // rows that see no key: exactly −inf
    } else {
      lse_err = std::fmax(lse_err, std::fabs(h_lse[i] - h_ref_lse[i]));
    }
  }
  // bf16 keeps 8 mantissa bits: outputs of magnitude < 2 round to within
  // 2^-8; two roundings' worth of slack. LSE is computed in fp32.
  const bool ok = finite && out_err < 2e-2 && lse_err < 1e-3;
  std::printf("batch %d, seqlen_q %d, seqlen_k %d, heads %d/%d, causal %d, prefix %d: max |out err| %.2e, "
              "max |lse err| %.2e, all written %s -> %s\n",
              pb.batch, pb.seqlen_q, pb.seqlen_k, pb.nheads, pb.nheads_k, int(pb.causal), pb.prefix_len, out_err,
              lse_err, finite ? "yes" : "no", ok ? "ok" : "FAIL");
  for (void* ptr : {(void*)q, (void*)k, (void*)v, (void*)out, (void*)lse, (void*)ref_out, (void*)ref_lse}) {
    CUDA_CHECK(cudaFree(ptr));
  }
  return ok;
}
