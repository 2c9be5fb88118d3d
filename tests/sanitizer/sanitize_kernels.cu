// Runs every registered kernel (flashtile::kernels) over a matrix of small
// problems, forward then backward (default and deterministic), for
// compute-sanitizer (tests/sanitizer/run.sh): odd seqlens on both sides, GQA,
// causal with seqlen_q > seqlen_k (rows that see no key) and the reverse,
// sliding windows, strided (padded) rows; the scoremod kernels with and
// without dropout. Then every KV-cache kernel: dense and paged caches (pages
// of 1, 16 and 64 rows), one split and several (the combine kernel), both
// pipeline depths, cache_seqlens of 0 and full, leftpad, causal, a window,
// softcap and ALiBi; and the append kernel (new rows into a dense and a
// paged cache, across a page boundary and past an entry's end, keys and
// queries rotated). It checks each Status and each kernel's error, and
// prints one line per problem; the numerics are the Python tests' job.
//   flashtile_sanitize_kernels              # everything
//   flashtile_sanitize_kernels kvcache      # the KV-cache kernels only
//   flashtile_sanitize_kernels no-dropout   # leave out the problems with dropout
//                                           # (which run the mma.sync kernels on sm90)
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>
#include <vector>

#include "flashtile/flashtile.hpp"

namespace {

struct Problem {
  int batch, seqlen_q, seqlen_k, nheads, nheads_k;
  bool causal;
  int window_left = -1, window_right = -1;
  // A variable-length batch when set: batch sequences of these lengths
  // (seqlen_q, seqlen_k their maxima), packed; used_k: seqused_k, or none.
  std::vector<int> lens_q = {}, lens_k = {}, used_k = {};
};

// Device int32 copy of v (nullptr when empty); cudaFree it.
int* device_ints(const std::vector<int>& v) {
  if (v.empty()) return nullptr;
  int* d = nullptr;
  cudaMalloc(&d, v.size() * sizeof(int));
  cudaMemcpy(d, v.data(), v.size() * sizeof(int), cudaMemcpyHostToDevice);
  return d;
}

// Device float copy of v; cudaFree it.
float* device_floats(const std::vector<float>& v) {
  float* d = nullptr;
  cudaMalloc(&d, v.size() * sizeof(float));
  cudaMemcpy(d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice);
  return d;
}

// ALiBi slopes for `count` (batch, head) pairs, 0.5 / (i + 1), on the device.
float* device_alibi_slopes(int count) {
  std::vector<float> slopes(count);
  for (int i = 0; i < count; ++i) slopes[i] = 0.5f / float(i + 1);
  return device_floats(slopes);
}

std::vector<int> offsets_of(const std::vector<int>& lens) {
  std::vector<int> cu(1, 0);
  for (int n : lens) cu.push_back(cu.back() + n);
  return cu;
}

// Fills n 2-byte elements with small pseudo-random values (a hash of the
// index), as bf16 or fp16 bit patterns.
__global__ void fill_kernel(uint16_t* data, size_t n, uint32_t seed, bool bf16) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    const float value = (float(x & 0xffff) / 65536.f - 0.5f) * 4.f;
    const uint32_t bits = __float_as_uint(value);
    data[i] = bf16 ? uint16_t(bits >> 16) : __half_as_ushort(__float2half(value));
  }
}

// One (batch, seqlen, heads, head_dim) tensor with rows padded by 8 elements,
// so that no stride equals its contiguous value.
struct Tensor4 {
  uint16_t* data = nullptr;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;
  size_t elements = 0;

  Tensor4(int batch, int seqlen, int heads, int head_dim) {
    head_stride = head_dim;
    row_stride = int64_t(heads) * head_dim + 8;
    batch_stride = int64_t(seqlen) * row_stride;
    elements = size_t(batch) * batch_stride;
    cudaMalloc(&data, elements * sizeof(uint16_t));
    cudaMemset(data, 0, elements * sizeof(uint16_t));
  }
  ~Tensor4() { cudaFree(data); }
  Tensor4(const Tensor4&) = delete;
  Tensor4& operator=(const Tensor4&) = delete;
};

bool check(const char* what, flashtile::Status status) {
  const cudaError_t err = cudaDeviceSynchronize();
  if (status != flashtile::Status::kSuccess || err != cudaSuccess) {
    std::printf("  FAILED %s: %s, %s\n", what, flashtile::status_string(status), cudaGetErrorString(err));
    return false;
  }
  return true;
}

bool run(const flashtile::KernelKey& key, const Problem& pr, bool deterministic, bool dropout, uint32_t seed) {
  const int d = key.head_dim;
  const bool bf16 = key.dtype == flashtile::DType::kBf16;
  // Varlen tensors are one packed sequence of all rows.
  const bool varlen = !pr.lens_q.empty();
  const std::vector<int> cu_q = offsets_of(pr.lens_q), cu_k = offsets_of(pr.lens_k);
  const int batches = varlen ? 1 : pr.batch;
  const int rows_q = varlen ? cu_q.back() : pr.seqlen_q, rows_k = varlen ? cu_k.back() : pr.seqlen_k;
  Tensor4 q(batches, rows_q, pr.nheads, d), k(batches, rows_k, pr.nheads_k, d), v(batches, rows_k, pr.nheads_k, d),
      out(batches, rows_q, pr.nheads, d), dout(batches, rows_q, pr.nheads, d), dq(batches, rows_q, pr.nheads, d),
      dk(batches, rows_k, pr.nheads_k, d), dv(batches, rows_k, pr.nheads_k, d);
  for (Tensor4* t : {&q, &k, &v, &dout}) fill_kernel<<<256, 256>>>(t->data, t->elements, seed++, bf16);
  float* lse = nullptr;
  cudaMalloc(&lse, size_t(batches) * pr.nheads * rows_q * sizeof(float));
  int *d_cu_q = varlen ? device_ints(cu_q) : nullptr, *d_cu_k = varlen ? device_ints(cu_k) : nullptr;
  int* d_used_k = device_ints(pr.used_k);
  // The scoremod kernels run with softcap and (batch, nheads) ALiBi slopes,
  // and with `dropout` also dropout, the forward then writing the
  // testing-only probabilities (rows and columns rounded up to 128, as
  // flashtile's Python layer allocates them); the backward has kernels with
  // and without dropout's code.
  const bool score_mod = key.variant == flashtile::Variant::kScoreMod;
  float* slopes = nullptr;
  int64_t* dropout_seed = nullptr;
  void* attn_probs = nullptr;
  const int probs_rows = (pr.seqlen_q + 127) / 128 * 128, probs_cols = (pr.seqlen_k + 127) / 128 * 128;
  if (score_mod) slopes = device_alibi_slopes(pr.batch * pr.nheads);
  if (score_mod && dropout) {
    const int64_t host_seed = 0x123456789abcdefLL + seed;
    cudaMalloc(&dropout_seed, sizeof(int64_t));
    cudaMemcpy(dropout_seed, &host_seed, sizeof(int64_t), cudaMemcpyHostToDevice);
    cudaMalloc(&attn_probs, size_t(pr.batch) * pr.nheads * probs_rows * probs_cols * 2);
  }

  flashtile::FwdParams f;
  f.q = q.data, f.k = k.data, f.v = v.data, f.out = out.data, f.lse = lse;
  f.q_batch_stride = q.batch_stride, f.q_row_stride = q.row_stride, f.q_head_stride = q.head_stride;
  f.k_batch_stride = k.batch_stride, f.k_row_stride = k.row_stride, f.k_head_stride = k.head_stride;
  f.v_batch_stride = v.batch_stride, f.v_row_stride = v.row_stride, f.v_head_stride = v.head_stride;
  f.out_batch_stride = out.batch_stride, f.out_row_stride = out.row_stride, f.out_head_stride = out.head_stride;
  f.batch = pr.batch, f.nheads = pr.nheads, f.nheads_k = pr.nheads_k;
  f.seqlen_q = pr.seqlen_q, f.seqlen_k = pr.seqlen_k, f.head_dim = d;
  f.softmax_scale = 0.125f, f.causal = pr.causal, f.dtype = key.dtype;
  f.window_left = pr.window_left, f.window_right = pr.window_right;
  if (score_mod) {
    f.softcap = 20.f, f.alibi_slopes = slopes, f.alibi_slopes_batch_stride = pr.nheads;
  }
  if (score_mod && dropout) {
    f.dropout_p = 0.3f, f.dropout_seed = dropout_seed;
    f.attn_probs = attn_probs, f.attn_probs_rows = probs_rows, f.attn_probs_cols = probs_cols;
  }
  if (varlen) {
    f.q_batch_stride = f.k_batch_stride = f.v_batch_stride = f.out_batch_stride = 0;
    f.cu_seqlens_q = d_cu_q, f.cu_seqlens_k = d_cu_k, f.seqused_k = d_used_k;
    f.total_q = rows_q, f.total_k = rows_k;
  }
  bool ok = check("fwd", flashtile::fwd(f, nullptr));

  flashtile::BwdParams b;
  b.q = q.data, b.k = k.data, b.v = v.data, b.out = out.data, b.dout = dout.data, b.lse = lse;
  b.dq = dq.data, b.dk = dk.data, b.dv = dv.data;
  b.q_batch_stride = f.q_batch_stride, b.q_row_stride = f.q_row_stride, b.q_head_stride = f.q_head_stride;
  b.k_batch_stride = f.k_batch_stride, b.k_row_stride = f.k_row_stride, b.k_head_stride = f.k_head_stride;
  b.v_batch_stride = f.v_batch_stride, b.v_row_stride = f.v_row_stride, b.v_head_stride = f.v_head_stride;
  b.out_batch_stride = f.out_batch_stride, b.out_row_stride = f.out_row_stride, b.out_head_stride = f.out_head_stride;
  b.dout_batch_stride = dout.batch_stride, b.dout_row_stride = dout.row_stride, b.dout_head_stride = dout.head_stride;
  b.dq_batch_stride = dq.batch_stride, b.dq_row_stride = dq.row_stride, b.dq_head_stride = dq.head_stride;
  b.dk_batch_stride = dk.batch_stride, b.dk_row_stride = dk.row_stride, b.dk_head_stride = dk.head_stride;
  b.dv_batch_stride = dv.batch_stride, b.dv_row_stride = dv.row_stride, b.dv_head_stride = dv.head_stride;
  b.batch = pr.batch, b.nheads = pr.nheads, b.nheads_k = pr.nheads_k;
  b.seqlen_q = pr.seqlen_q, b.seqlen_k = pr.seqlen_k, b.head_dim = d;
  b.softmax_scale = f.softmax_scale, b.causal = pr.causal, b.deterministic = deterministic, b.dtype = key.dtype;
  b.window_left = pr.window_left, b.window_right = pr.window_right;
  b.softcap = f.softcap, b.alibi_slopes = f.alibi_slopes, b.alibi_slopes_batch_stride = f.alibi_slopes_batch_stride;
  b.dropout_p = f.dropout_p, b.dropout_seed = f.dropout_seed;
  b.cu_seqlens_q = f.cu_seqlens_q, b.cu_seqlens_k = f.cu_seqlens_k, b.seqused_k = f.seqused_k;
  b.total_q = f.total_q, b.total_k = f.total_k;
  if (varlen) b.dout_batch_stride = b.dq_batch_stride = b.dk_batch_stride = b.dv_batch_stride = 0;
  void* workspace = nullptr;
  cudaMalloc(&workspace, flashtile::bwd_workspace_bytes(b));
  b.workspace = workspace;
  ok = check(deterministic ? "bwd deterministic" : "bwd", flashtile::bwd(b, nullptr)) && ok;
  cudaFree(workspace);
  cudaFree(lse);
  cudaFree(slopes);
  cudaFree(dropout_seed);
  cudaFree(attn_probs);
  cudaFree(d_cu_q);
  cudaFree(d_cu_k);
  cudaFree(d_used_k);
  return ok;
}

// Attention of seqlen_q queries per sequence against a KV cache that holds
// `capacity` keys an entry: dense when page_size is 0, else pages of that
// many rows handed out in a scrambled order.
struct KvProblem {
  int batch, seqlen_q, capacity, nheads, nheads_k, page_size, num_splits;
  std::vector<int> seqlens, leftpad = {};
  bool causal = false;
  int window_left = -1, window_right = -1;
  bool score_mod = false;  // softcap and (batch, nheads) ALiBi slopes
};

bool run_kvcache(int d, flashtile::DType dtype, const KvProblem& pr, uint32_t seed) {
  const bool bf16 = dtype == flashtile::DType::kBf16;
  const bool paged = pr.page_size > 0;
  const int pages_per_seq = paged ? (pr.capacity + pr.page_size - 1) / pr.page_size : 0;
  const int num_pages = pr.batch * pages_per_seq + 1;  // one page nobody's
  Tensor4 q(pr.batch, pr.seqlen_q, pr.nheads, d), out(pr.batch, pr.seqlen_q, pr.nheads, d);
  Tensor4 k(paged ? num_pages : pr.batch, paged ? pr.page_size : pr.capacity, pr.nheads_k, d);
  Tensor4 v(paged ? num_pages : pr.batch, paged ? pr.page_size : pr.capacity, pr.nheads_k, d);
  for (Tensor4* t : {&q, &k, &v}) fill_kernel<<<256, 256>>>(t->data, t->elements, seed++, bf16);
  std::vector<int> table;
  for (int i = 0; i < pr.batch * pages_per_seq; ++i) table.push_back(int((int64_t(i) * 7 + 3) % num_pages));
  int* d_table = device_ints(table);
  int* d_seqlens = device_ints(pr.seqlens);
  int* d_leftpad = device_ints(pr.leftpad);
  float* lse = nullptr;
  cudaMalloc(&lse, size_t(pr.batch) * pr.nheads * pr.seqlen_q * sizeof(float));
  float* slopes = nullptr;
  if (pr.score_mod) slopes = device_alibi_slopes(pr.batch * pr.nheads);

  flashtile::KvCacheParams p;
  p.q = q.data, p.k_cache = k.data, p.v_cache = v.data, p.out = out.data, p.lse = lse;
  p.q_batch_stride = q.batch_stride, p.q_row_stride = q.row_stride, p.q_head_stride = q.head_stride;
  p.k_page_stride = k.batch_stride, p.k_row_stride = k.row_stride, p.k_head_stride = k.head_stride;
  p.v_page_stride = v.batch_stride, p.v_row_stride = v.row_stride, p.v_head_stride = v.head_stride;
  p.out_batch_stride = out.batch_stride, p.out_row_stride = out.row_stride, p.out_head_stride = out.head_stride;
  if (paged) p.block_table = d_table, p.block_table_batch_stride = pages_per_seq, p.page_size = pr.page_size;
  p.cache_seqlens = d_seqlens, p.cache_leftpad = d_leftpad;
  p.batch = pr.batch, p.nheads = pr.nheads, p.nheads_k = pr.nheads_k, p.seqlen_q = pr.seqlen_q;
  p.seqlen_k = paged ? pages_per_seq * pr.page_size : pr.capacity, p.head_dim = d;
  p.softmax_scale = 0.125f, p.causal = pr.causal, p.window_left = pr.window_left, p.window_right = pr.window_right;
  if (pr.score_mod) p.softcap = 20.f, p.alibi_slopes = slopes, p.alibi_slopes_batch_stride = pr.nheads;
  p.num_splits = pr.num_splits, p.dtype = dtype;
  p.num_splits = flashtile::resolve_kvcache_splits(p);
  void* workspace = nullptr;
  const int64_t workspace_bytes = flashtile::kvcache_workspace_bytes(p);
  if (workspace_bytes > 0) cudaMalloc(&workspace, workspace_bytes);
  p.workspace = workspace;
  std::printf("  %d splits\n", p.num_splits);
  const bool ok = check("kvcache", flashtile::kvcache(p, nullptr));
  cudaFree(workspace);
  cudaFree(slopes);
  cudaFree(lse);
  cudaFree(d_table);
  cudaFree(d_seqlens);
  cudaFree(d_leftpad);
  return ok;
}

// The append kernel at head dim d: 3 new rows a sequence into a cache of
// `capacity` rows an entry (dense, or pages of page_size rows), sequence 0
// at 14 cached rows (across a 16-row page's end), sequence 1 at capacity - 1
// (its last new rows fall past the entry and are not written); keys rotated
// over half the features by fp32 tables, the queries rotated into a copy.
bool run_append(int d, flashtile::DType dtype, int page_size, bool interleaved, uint32_t seed) {
  const bool bf16 = dtype == flashtile::DType::kBf16;
  const int batch = 2, seqlen_new = 3, nheads = 4, nheads_k = 2, capacity = 48;
  const bool paged = page_size > 0;
  const int pages_per_seq = paged ? (capacity + page_size - 1) / page_size : 0;
  const int num_pages = batch * pages_per_seq + 1;
  Tensor4 k(batch, seqlen_new, nheads_k, d), v(batch, seqlen_new, nheads_k, d);
  Tensor4 q(batch, seqlen_new, nheads, d), q_out(batch, seqlen_new, nheads, d);
  Tensor4 k_cache(paged ? num_pages : batch, paged ? page_size : capacity, nheads_k, d);
  Tensor4 v_cache(paged ? num_pages : batch, paged ? page_size : capacity, nheads_k, d);
  for (Tensor4* t : {&k, &v, &q, &k_cache, &v_cache}) fill_kernel<<<256, 256>>>(t->data, t->elements, seed++, bf16);
  const int rotary_dim = d / 2, seqlen_ro = capacity + seqlen_new;
  std::vector<float> cos_sin(size_t(seqlen_ro) * rotary_dim / 2);
  for (size_t i = 0; i < cos_sin.size(); ++i) cos_sin[i] = 0.5f + 0.001f * float(i % 97);
  float* table_cos = device_floats(cos_sin);
  float* table_sin = device_floats(cos_sin);
  std::vector<int> table;
  for (int i = 0; i < batch * pages_per_seq; ++i) table.push_back(int((int64_t(i) * 7 + 3) % num_pages));
  int* d_table = device_ints(table);
  int* d_seqlens = device_ints({14, capacity - 1});
  int* d_seqlens_out = device_ints({0, 0});

  flashtile::KvAppendParams p;
  p.k = k.data, p.v = v.data;
  p.k_batch_stride = k.batch_stride, p.k_row_stride = k.row_stride, p.k_head_stride = k.head_stride;
  p.v_batch_stride = v.batch_stride, p.v_row_stride = v.row_stride, p.v_head_stride = v.head_stride;
  p.k_cache = k_cache.data, p.v_cache = v_cache.data;
  p.k_page_stride = k_cache.batch_stride, p.k_cache_row_stride = k_cache.row_stride;
  p.k_cache_head_stride = k_cache.head_stride;
  p.v_page_stride = v_cache.batch_stride, p.v_cache_row_stride = v_cache.row_stride;
  p.v_cache_head_stride = v_cache.head_stride;
  if (paged) p.block_table = d_table, p.block_table_batch_stride = pages_per_seq, p.page_size = page_size;
  p.cache_seqlens = d_seqlens, p.cache_seqlens_out = d_seqlens_out;
  p.q = q.data, p.q_out = q_out.data;
  p.q_batch_stride = q.batch_stride, p.q_row_stride = q.row_stride, p.q_head_stride = q.head_stride;
  p.q_out_batch_stride = q_out.batch_stride, p.q_out_row_stride = q_out.row_stride;
  p.q_out_head_stride = q_out.head_stride;
  p.rotary_cos = table_cos, p.rotary_sin = table_sin, p.rotary_row_stride = rotary_dim / 2;
  p.rotary_fp32 = true, p.rotary_interleaved = interleaved, p.rotary_dim = rotary_dim, p.seqlen_ro = seqlen_ro;
  p.batch = batch, p.seqlen_new = seqlen_new, p.seqlen_q = seqlen_new, p.nheads = nheads, p.nheads_k = nheads_k;
  p.head_dim = d, p.seqlen_k = paged ? pages_per_seq * page_size : capacity, p.dtype = dtype;
  const bool ok = check("kvcache_append", flashtile::kvcache_append(p, nullptr));
  cudaFree(table_cos);
  cudaFree(table_sin);
  cudaFree(d_table);
  cudaFree(d_seqlens);
  cudaFree(d_seqlens_out);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool kvcache_only = mode == "kvcache", with_dropout = mode != "no-dropout";
  const Problem problems[] = {
      {2, 17, 33, 4, 2, false}, {2, 17, 33, 4, 2, true},     // short, GQA, seqlen_q < seqlen_k
      {1, 130, 67, 2, 1, true},                              // rows that see no key
      {1, 257, 129, 4, 4, false}, {1, 129, 257, 4, 4, true},  // several blocks, partial last ones
      {1, 257, 129, 4, 2, false, 40, 7},                      // sliding window, rows that see no key
      {1, 129, 257, 4, 4, true, 64},                          // causal window
      // varlen: empty sequences, partial blocks, seqused_k, a window
      {3, 300, 260, 4, 2, true, -1, -1, {130, 0, 300}, {1, 260, 200}, {1, 100, 200}},
      {3, 257, 129, 4, 4, false, 40, 7, {5, 257, 64}, {129, 0, 77}},
  };
  int runs = 0, failures = 0;
  uint32_t seed = 1;
  // One pass per (head dim, dtype, variant): flashtile::fwd and
  // flashtile::bwd pick the arch's kernels, so a key registered for sm80 and
  // for sm90 would run the same kernels twice.
  std::vector<flashtile::KernelKey> passes;
  for (const flashtile::KernelKey& key : flashtile::KernelRegistry::instance().keys()) {
    if (kvcache_only || key.direction != flashtile::Direction::kFwd) continue;
    bool seen = false;
    for (const flashtile::KernelKey& pass : passes) {
      seen = seen || (pass.head_dim == key.head_dim && pass.dtype == key.dtype && pass.variant == key.variant);
    }
    if (!seen) passes.push_back(key);
  }
  for (const flashtile::KernelKey& key : passes) {
    const bool score_mod = key.variant == flashtile::Variant::kScoreMod;
    for (const Problem& pr : problems) {
      for (bool deterministic : {false, true}) {
        for (int dropout = score_mod && with_dropout ? 1 : 0; dropout >= 0; --dropout) {
          std::printf("hdim %d %s %s: batch %d seqlen_q %d seqlen_k %d heads %d/%d causal %d window (%d, %d) "
                      "varlen %d deterministic %d dropout %d\n",
                      key.head_dim, flashtile::dtype_name(key.dtype), flashtile::variant_name(key.variant), pr.batch,
                      pr.seqlen_q, pr.seqlen_k, pr.nheads, pr.nheads_k, int(pr.causal), pr.window_left,
                      pr.window_right, int(!pr.lens_q.empty()), int(deterministic), dropout);
          ++runs;
          if (!run(key, pr, deterministic, dropout == 1, seed)) ++failures;
          seed += 16;
        }
      }
    }
  }
  // At head dim 128 the 700-key problems take the 3-stage pipeline (11
  // blocks a split, a dense cache or 64-row pages) on a GPU with the shared
  // memory, the 2100-key one the 2-stage one.
  const KvProblem kv_problems[] = {
      {2, 1, 700, 8, 2, 0, 1, {700, 0}},                                   // dense; full and empty
      {2, 3, 700, 8, 2, 0, 3, {513, 9}, {5, 0}, true},                     // leftpad, causal, combine
      {2, 1, 2100, 8, 2, 0, 1, {2100, 1500}},                              // long split
      {2, 1, 1024, 8, 2, 16, 0, {1000, 37}},                               // 16-row pages, chosen splits
      {2, 2, 700, 8, 2, 64, 2, {640, 3}, {}, false, 32, 0, true},          // 64-row pages, window, softcap, ALiBi
      {2, 1, 40, 4, 4, 1, 1, {40, 17}},                                    // 1-row pages, MHA
  };
  for (const auto& entry : flashtile::KvCacheRegistry::instance().entries()) {
    for (const KvProblem& pr : kv_problems) {
      std::printf("kvcache hdim %d %s: batch %d seqlen_q %d capacity %d heads %d/%d page %d splits %d causal %d "
                  "window (%d, %d) score_mod %d\n",
                  entry.head_dim, flashtile::dtype_name(entry.dtype), pr.batch, pr.seqlen_q, pr.capacity, pr.nheads,
                  pr.nheads_k, pr.page_size, pr.num_splits, int(pr.causal), pr.window_left, pr.window_right,
                  int(pr.score_mod));
      ++runs;
      if (!run_kvcache(entry.head_dim, entry.dtype, pr, seed)) ++failures;
      seed += 16;
    }
  }
  for (const auto& entry : flashtile::KvCacheRegistry::instance().entries()) {
    for (int page_size : {0, 16}) {
      std::printf("kvcache_append hdim %d %s: page %d interleaved %d\n", entry.head_dim,
                  flashtile::dtype_name(entry.dtype), page_size, int(page_size > 0));
      ++runs;
      if (!run_append(entry.head_dim, entry.dtype, page_size, page_size > 0, seed)) ++failures;
      seed += 16;
    }
  }
  std::printf("%d problems, %d failed\n", runs, failures);
  return failures == 0 && runs > 0 ? 0 : 1;
}
