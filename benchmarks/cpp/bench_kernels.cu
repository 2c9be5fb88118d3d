// Times every forward kernel in this build's dispatch table beside cuBLAS on
// matched shapes, in one process: cublasGemmStridedBatchedEx on QKᵀ's shape
// (b·h × [sq × d]·[d × sk]) and on P·V's shape (b·h × [sq × sk]·[sk × d]) --
// the two matmuls attention is made of, at cuBLAS's rate -- and one large
// square GEMM. Standard sweep shapes (batch · seqlen = 16384, nheads · hdim =
// 2048). CUDA events around each call, warm-up first, median of the repeats,
// L2 flushed before every call. Prints TFLOP/s and flashtile ÷ cuBLAS; writes
// rows in the results schema of BENCHMARKING.md.
//
//   flashtile_bench [--csv PATH] [--seqlens 1024,4096,16384] [--reps N] [--commit REV]
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <flashtile/flashtile.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

namespace {

constexpr int kTokens = 16384;  // batch · seqlen
constexpr int kHidden = 2048;   // nheads · head_dim
constexpr int64_t kL2FlushBytes = 256ll << 20;

#define CUDA_CHECK(call)                                                                     \
  do {                                                                                       \
    cudaError_t err_ = (call);                                                               \
    if (err_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_));    \
      std::exit(2);                                                                          \
    }                                                                                        \
  } while (0)
#define CUBLAS_CHECK(call)                                                                   \
  do {                                                                                       \
    cublasStatus_t st_ = (call);                                                             \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                      \
      std::fprintf(stderr, "%s:%d: cuBLAS status %d\n", __FILE__, __LINE__, int(st_));       \
      std::exit(2);                                                                          \
    }                                                                                        \
  } while (0)

// Random 16-bit values (fp16 or bf16 bit patterns of numbers in [-1.7, 1.7)),
// never zeros: timing on zeros flatters matmuls.
__global__ void fill_random(uint16_t* x, int64_t n, uint64_t seed, bool bf16) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  uint64_t h = (uint64_t(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 31;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 29;
  const float f = (float(h & 0xFFFFFF) / float(1 << 24) - 0.5f) * 3.46f;
  if (bf16) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    x[i] = uint16_t(bits >> 16);
  } else {
    x[i] = __half_as_ushort(__float2half(f));
  }
}

// Median milliseconds of fn() over `reps` calls after `warmup` calls, each
// call preceded by a memset larger than L2 so no call finds its inputs cached.
double time_ms(const std::function<void()>& fn, void* flush, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<cudaEvent_t> starts(reps), ends(reps);
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventCreate(&starts[i]));
    CUDA_CHECK(cudaEventCreate(&ends[i]));
  }
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaMemsetAsync(flush, i & 0xff, kL2FlushBytes));
    CUDA_CHECK(cudaEventRecord(starts[i]));
    fn();
    CUDA_CHECK(cudaEventRecord(ends[i]));
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> ms(reps);
  for (int i = 0; i < reps; ++i) {
    float t;
    CUDA_CHECK(cudaEventElapsedTime(&t, starts[i], ends[i]));
    ms[i] = t;
    CUDA_CHECK(cudaEventDestroy(starts[i]));
    CUDA_CHECK(cudaEventDestroy(ends[i]));
  }
  std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
  return ms[reps / 2];
}

struct Row {
  std::string impl, dtype;
  int hdim, causal, batch, nheads, seqlen_q, seqlen_k;
  double ms, tflops;
};

}  // namespace

int main(int argc, char** argv) {
  std::string csv_path, commit = "unknown", command = argv[0];
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  std::vector<int> seqlens = {1024, 4096, 16384};
  int reps = 30;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--csv" && i + 1 < argc) {
      csv_path = argv[++i];
    } else if (arg == "--commit" && i + 1 < argc) {
      commit = argv[++i];
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::max(3, std::atoi(argv[++i]));
    } else if (arg == "--seqlens" && i + 1 < argc) {
      seqlens.clear();
      for (char* tok = std::strtok(argv[++i], ","); tok; tok = std::strtok(nullptr, ",")) {
        seqlens.push_back(std::atoi(tok));
      }
    } else {
      std::fprintf(stderr, "usage: %s [--csv PATH] [--seqlens 1024,4096,16384] [--reps N] [--commit REV]\n",
                   argv[0]);
      return 2;
    }
  }
  for (int s : seqlens) {
    if (s < 1 || kTokens % s != 0) {
      std::fprintf(stderr, "--seqlens: each must divide %d\n", kTokens);
      return 2;
    }
  }

  const std::vector<flashtile::KernelKey> kernels = flashtile::KernelRegistry::instance().keys();
  if (kernels.empty()) {
    std::fprintf(stderr, "no kernels registered: link flashtile::kernels\n");
    return 2;
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %zu kernels, seqlens", prop.name, kernels.size());
  for (int s : seqlens) std::printf(" %d", s);
  std::printf(", median of %d\n", reps);

  // q/k/v/out hold kTokens · kHidden elements in every case; the score
  // buffer of the QKᵀ product is largest at the longest seqlen, d = 64.
  const int max_seqlen = *std::max_element(seqlens.begin(), seqlens.end());
  const int64_t n_qkv = int64_t(kTokens) * kHidden;
  int min_hdim = 1 << 30;
  for (const auto& key : kernels) min_hdim = std::min(min_hdim, key.head_dim);
  const int64_t n_scores = int64_t(kTokens) * (kHidden / min_hdim) * max_seqlen;
  constexpr int n = 8192;  // the square GEMM
  const int64_t n_gemm = int64_t(n) * n;
  uint16_t *q, *k, *v, *out, *scores, *gemm_a, *gemm_b, *gemm_c;
  float* lse;
  void* flush;
  CUDA_CHECK(cudaMalloc(&q, n_qkv * 2));
  CUDA_CHECK(cudaMalloc(&k, n_qkv * 2));
  CUDA_CHECK(cudaMalloc(&v, n_qkv * 2));
  CUDA_CHECK(cudaMalloc(&out, n_qkv * 2));
  CUDA_CHECK(cudaMalloc(&scores, n_scores * 2));
  CUDA_CHECK(cudaMalloc(&lse, int64_t(kTokens) * (kHidden / min_hdim) * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&flush, kL2FlushBytes));
  CUDA_CHECK(cudaMalloc(&gemm_a, n_gemm * 2));
  CUDA_CHECK(cudaMalloc(&gemm_b, n_gemm * 2));
  CUDA_CHECK(cudaMalloc(&gemm_c, n_gemm * 2));
  cublasHandle_t cublas;
  CUBLAS_CHECK(cublasCreate(&cublas));

  std::vector<Row> rows;
  auto fill_all = [&](bool bf16) {
    fill_random<<<(n_qkv + 255) / 256, 256>>>(q, n_qkv, 1, bf16);
    fill_random<<<(n_qkv + 255) / 256, 256>>>(k, n_qkv, 2, bf16);
    fill_random<<<(n_qkv + 255) / 256, 256>>>(v, n_qkv, 3, bf16);
    fill_random<<<(n_scores + 255) / 256, 256>>>(scores, n_scores, 4, bf16);
    CUDA_CHECK(cudaGetLastError());
  };

  // One large square GEMM per dtype: the matmul ceiling.
  for (flashtile::DType dtype : {flashtile::DType::kFp16, flashtile::DType::kBf16}) {
    const bool bf16 = dtype == flashtile::DType::kBf16;
    const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    fill_random<<<(n_gemm + 255) / 256, 256>>>(gemm_a, n_gemm, 5, bf16);
    fill_random<<<(n_gemm + 255) / 256, 256>>>(gemm_b, n_gemm, 6, bf16);
    CUDA_CHECK(cudaGetLastError());
    const float alpha = 1.f, beta = 0.f;
    const double ms = time_ms([&] {
      CUBLAS_CHECK(cublasGemmEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, gemm_a, type, n, gemm_b,
                                type, n, &beta, gemm_c, type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }, flush, 5, reps);
    const double tflops = 2.0 * n * n * n / ms / 1e9;
    rows.push_back({"cublas_gemm", flashtile::dtype_name(dtype), n, 0, 1, 1, n, n, ms, tflops});
    std::printf("cublas_gemm %s 8192^3: %.1f TFLOP/s\n", flashtile::dtype_name(dtype), tflops);
  }

  std::printf("\n%-5s %4s %6s %6s | %9s %10s %10s | %14s %14s\n", "dtype", "hdim", "causal", "seqlen",
              "flashtile", "bmm QK^T", "bmm PV", "ft/(QK^T+PV)", "ft/gemm8192");
  for (const auto& key : kernels) {
    // Times the plain forward kernels.
    if (key.direction != flashtile::Direction::kFwd || key.variant != flashtile::Variant::kPlain) continue;
    const bool bf16 = key.dtype == flashtile::DType::kBf16;
    const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    const int d = key.head_dim;
    fill_all(bf16);
    double gemm_tflops = 0;
    for (const Row& r : rows) {
      if (r.impl == "cublas_gemm" && r.dtype == flashtile::dtype_name(key.dtype)) gemm_tflops = r.tflops;
    }
    for (int s : seqlens) {
      const int b = kTokens / s, h = kHidden / d;
      const int64_t bh = int64_t(b) * h;
      const double matmul_flops = 2.0 * bh * s * double(s) * d;  // each of QKᵀ and P·V
      const float alpha = 1.f, beta = 0.f;
      // cuBLAS is column-major: S (s × s, row-major) = Q·Kᵀ is Sᵀ = K·Qᵀ in
      // column-major terms, over contiguous (b·h, s, d) operands.
      const double ms_qk = time_ms([&] {
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(
            cublas, CUBLAS_OP_T, CUBLAS_OP_N, s, s, d, &alpha, k, type, d, int64_t(s) * d, q, type, d,
            int64_t(s) * d, &beta, scores, type, s, int64_t(s) * s, int(bh), CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT));
      }, flush, 5, reps);
      // O (s × d) = P (s × s) · V (s × d): Oᵀ = Vᵀ·Pᵀ column-major.
      const double ms_pv = time_ms([&] {
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(
            cublas, CUBLAS_OP_N, CUBLAS_OP_N, d, s, s, &alpha, v, type, d, int64_t(s) * d, scores, type, s,
            int64_t(s) * s, &beta, out, type, d, int64_t(s) * d, int(bh), CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT));
      }, flush, 5, reps);
      rows.push_back({"cublas_bmm", flashtile::dtype_name(key.dtype), d, 0, b, h, s, s, ms_qk,
                      matmul_flops / ms_qk / 1e9});
      rows.push_back({"cublas_bmm_pv", flashtile::dtype_name(key.dtype), d, 0, b, h, s, s, ms_pv,
                      matmul_flops / ms_pv / 1e9});
      const double pair_tflops = 2 * matmul_flops / (ms_qk + ms_pv) / 1e9;

      for (int causal = 0; causal < 2; ++causal) {
        flashtile::FwdParams p;  // contiguous (b, s, h, d)
        p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
        p.batch = b, p.seqlen_q = s, p.seqlen_k = s, p.nheads = h, p.nheads_k = h, p.head_dim = d;
        p.q_row_stride = p.k_row_stride = p.v_row_stride = p.out_row_stride = int64_t(h) * d;
        p.q_head_stride = p.k_head_stride = p.v_head_stride = p.out_head_stride = d;
        p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.out_batch_stride = int64_t(s) * h * d;
        p.softmax_scale = 1.f / std::sqrt(float(d));
        p.causal = causal;
        p.dtype = key.dtype;
        const flashtile::Status st = flashtile::fwd(p, 0);
        if (st != flashtile::Status::kSuccess) {
          std::fprintf(stderr, "flashtile::fwd: %s\n", flashtile::status_string(st));
          return 1;
        }
        const double ms = time_ms([&] { flashtile::fwd(p, 0); }, flush, 5, reps);
        const double flops = 4.0 * bh * s * double(s) * d / (causal ? 2 : 1);
        const double tflops = flops / ms / 1e9;
        rows.push_back({"flashtile", flashtile::dtype_name(key.dtype), d, causal, b, h, s, s, ms, tflops});
        std::printf("%-5s %4d %6d %6d | %9.1f %10.1f %10.1f | %14.2f %14.2f\n",
                    flashtile::dtype_name(key.dtype), d, causal, s, tflops, matmul_flops / ms_qk / 1e9,
                    matmul_flops / ms_pv / 1e9, tflops / pair_tflops, tflops / gemm_tflops);
      }
    }
  }
  CUDA_CHECK(cudaGetLastError());

  if (!csv_path.empty()) {
    FILE* f = std::fopen(csv_path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", csv_path.c_str());
      return 1;
    }
    int runtime = 0;
    cudaRuntimeGetVersion(&runtime);
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    std::fprintf(f, "# gpu=%s, cuda_runtime=%d, cublas=%d, commit=%s, date=%s, cmd=%s, "
                    "impl cublas_bmm = QK^T shape, cublas_bmm_pv = PV shape\n",
                 prop.name, runtime, CUBLAS_VERSION, commit.c_str(), date, command.c_str());
    std::fprintf(f, "impl,direction,dtype,hdim,causal,window_left,window_right,batch,nheads,nheads_k,"
                    "seqlen_q,seqlen_k,ms,tflops\n");
    for (const Row& r : rows) {
      std::fprintf(f, "%s,fwd,%s,%d,%d,-1,-1,%d,%d,%d,%d,%d,%.4f,%.1f\n", r.impl.c_str(), r.dtype.c_str(),
                   r.hdim, r.causal, r.batch, r.nheads, r.nheads, r.seqlen_q, r.seqlen_k, r.ms, r.tflops);
    }
    std::fclose(f);
    std::printf("wrote %s\n", csv_path.c_str());
  }
  return 0;
}
