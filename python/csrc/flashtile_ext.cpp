// flashtile._C: the nanobind extension. It takes arrays through DLPack
// (nb::ndarray), never links libtorch, checks what it is handed, and calls
// the C++ core, turning a Status into a Python exception.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "flashtile/flashtile.hpp"

namespace nb = nanobind;

namespace {

using CudaArray = nb::ndarray<nb::device::cuda>;  // any dtype, any strides

[[noreturn]] void raise_value_error(const std::string& message) {
  throw nb::value_error(message.c_str());
}

void require(bool ok, const std::string& message) {
  if (!ok) raise_value_error(message);
}

bool is_dtype(const CudaArray& a, nb::dlpack::dtype_code code, int bits) {
  return a.dtype() == nb::dlpack::dtype{static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
}

flashtile::DType element_dtype(const CudaArray& a, const char* name) {
  if (is_dtype(a, nb::dlpack::dtype_code::Float, 16)) return flashtile::DType::kFp16;
  if (is_dtype(a, nb::dlpack::dtype_code::Bfloat, 16)) return flashtile::DType::kBf16;
  raise_value_error(std::string(name) + " must be float16 or bfloat16");
}

// An array as the kernels see it: 4-D (batch, rows, heads, head_dim). A
// varlen array is 3-D (total, heads, head_dim), one packed sequence: batch 1
// with stride 0. The kernels move 16-byte vectors: base pointer and every
// stride but the last (which must be 1) must be multiples of 16 bytes.
class Rows4 {
 public:
  Rows4(const CudaArray& a, const char* name, bool varlen) : a_(a), lead_(varlen ? 1 : 0) {
    require(a.ndim() == size_t(4 - lead_), std::string(name) + (varlen ? " must be 3-D (total, nheads, head_dim)"
                                                                      : " must be 4-D (batch, seqlen, nheads, head_dim)"));
    const int last = int(a.ndim()) - 1;
    require(a.stride(last) == 1, std::string(name) + " must have a contiguous last dim (stride 1)");
    require(reinterpret_cast<uintptr_t>(a.data()) % 16 == 0,
            std::string(name) + ": data pointer must be 16-byte aligned");
    for (int i = 0; i < last; ++i) {
      require(a.stride(i) * 2 % 16 == 0,
              std::string(name) + ": strides of every dim but the last must be multiples of 16 bytes, got " +
                  std::to_string(a.stride(i)) + " elements in dim " + std::to_string(i));
    }
  }
  int64_t shape(int i) const { return i < lead_ ? 1 : int64_t(a_.shape(i - lead_)); }
  int64_t stride(int i) const { return i < lead_ ? 0 : a_.stride(i - lead_); }
  void strides(int64_t& batch, int64_t& row, int64_t& head) const { batch = stride(0), row = stride(1), head = stride(2); }

 private:
  const CudaArray& a_;
  int lead_;
};

// lse: (batch, nheads, seqlen_q) fp32, or (nheads, total_q) when varlen, contiguous.
void require_lse(const CudaArray& lse, const Rows4& q, bool varlen) {
  require(is_dtype(lse, nb::dlpack::dtype_code::Float, 32), "lse must be float32");
  const std::string shape = varlen ? "(nheads, total_q)" : "(batch, nheads, seqlen_q)";
  const int lead = varlen ? 1 : 0;
  auto dim = [&](int i) { return i < lead ? int64_t(1) : int64_t(lse.shape(i - lead)); };
  require(lse.ndim() == size_t(3 - lead) && dim(0) == q.shape(0) && dim(1) == q.shape(2) && dim(2) == q.shape(1),
          "lse must have shape " + shape);
  int64_t expected = 1;
  for (int i = int(lse.ndim()) - 1; i >= 0; --i) {
    require(lse.shape(i) <= 1 || lse.stride(i) == expected, "lse must be contiguous");
    expected *= int64_t(lse.shape(i));
  }
}

// A variable-length batch's offsets: cu_seqlens_q and cu_seqlens_k int32,
// 1-D, contiguous, batch + 1 entries; seqused_k int32 (batch,). The arrays'
// rows become total_q and total_k, the maxima seqlen_q and seqlen_k.
struct VarlenArgs {
  const std::optional<CudaArray>& cu_seqlens_q;
  const std::optional<CudaArray>& cu_seqlens_k;
  const std::optional<CudaArray>& seqused_k;
  int max_seqlen_q;
  int max_seqlen_k;
  bool on() const { return cu_seqlens_q.has_value(); }
};

void require_int32_vector(const CudaArray& a, const char* name, int64_t length, int device) {
  require(is_dtype(a, nb::dlpack::dtype_code::Int, 32), std::string(name) + " must be int32");
  require(a.ndim() == 1 && int64_t(a.shape(0)) == length,
          std::string(name) + " must be 1-D of length " + std::to_string(length));
  require(a.shape(0) <= 1 || a.stride(0) == 1, std::string(name) + " must be contiguous");
  require(a.device_id() == device, std::string(name) + " must be on q's CUDA device");
}

template <class Params>
void set_varlen(Params& p, const VarlenArgs& vl, int device) {
  require(vl.cu_seqlens_q.has_value() == vl.cu_seqlens_k.has_value(),
          "cu_seqlens_q and cu_seqlens_k must be given together");
  require(vl.on() || !vl.seqused_k.has_value(), "seqused_k needs cu_seqlens_q and cu_seqlens_k");
  if (!vl.on()) return;
  require(vl.cu_seqlens_q->ndim() == 1 && vl.cu_seqlens_q->shape(0) >= 2,
          "cu_seqlens_q must be 1-D with batch + 1 >= 2 entries");
  const int64_t entries = int64_t(vl.cu_seqlens_q->shape(0));
  require_int32_vector(*vl.cu_seqlens_q, "cu_seqlens_q", entries, device);
  require_int32_vector(*vl.cu_seqlens_k, "cu_seqlens_k", entries, device);
  if (vl.seqused_k) require_int32_vector(*vl.seqused_k, "seqused_k", entries - 1, device);
  require(vl.max_seqlen_q >= 1 && vl.max_seqlen_k >= 1, "max_seqlen_q and max_seqlen_k must be >= 1");
  p.total_q = p.seqlen_q, p.total_k = p.seqlen_k;  // the packed rows
  p.batch = int(entries - 1);
  p.seqlen_q = vl.max_seqlen_q, p.seqlen_k = vl.max_seqlen_k;
  p.cu_seqlens_q = static_cast<const int*>(vl.cu_seqlens_q->data());
  p.cu_seqlens_k = static_cast<const int*>(vl.cu_seqlens_k->data());
  p.seqused_k = vl.seqused_k ? static_cast<const int*>(vl.seqused_k->data()) : nullptr;
}

// Turns a Status into the Python exception a caller of flashtile expects.
void raise_for_status(flashtile::Status status, const char* direction, int head_dim,
                      flashtile::DType dtype, flashtile::Variant variant) {
  if (status == flashtile::Status::kSuccess) return;
  const std::string what = std::string("flashtile.") + direction + ": ";
  if (status == flashtile::Status::kCudaError) {
    throw std::runtime_error(what + "CUDA error: " + cudaGetErrorString(cudaGetLastError()));
  }
  if (status == flashtile::Status::kUnsupportedDevice) {  // RuntimeError, like the capability check
    throw std::runtime_error(what + flashtile::status_string(status) + " (head_dim=" + std::to_string(head_dim) +
                             "; the backward needs the 163 KB of sm80 or the 227 KB of sm90)");
  }
  if (status == flashtile::Status::kNotBuilt) {  // RuntimeError, like the Python layer's check
    // A build with 90a compiles for its other archs only the sm80 kernels an
    // H100/H200 does not run, and the tiles of smaller shared-memory budgets
    // (flashtile.hpp's find_sm80): a dispatch limit or a row stride of 0 can
    // still ask for them there.
    const std::string dir(direction);
    const bool not_for_sm90 = (dir == "fwd" || dir == "bwd") &&
                              flashtile::sm90_code_required(flashtile::KernelRegistry::instance());
    throw std::runtime_error(what + "the kernel for head_dim=" + std::to_string(head_dim) +
                             ", dtype=" + flashtile::dtype_name(dtype) + ", variant=" +
                             flashtile::variant_name(variant) + " is not built in this flashtile build" +
                             (not_for_sm90 ? " for this H100/H200's sm90 on the sm80 path (a dispatch limited to "
                                             "sm80 or to a smaller shared-memory budget, or q, k, v with rows of "
                                             "stride 0; FLASHTILE_SM80_ON_SM90 and FLASHTILE_SMEM_BUDGETS, "
                                             "docs/build.md)"
                                           : ""));
  }
  raise_value_error(what + flashtile::status_string(status) + " (head_dim=" +
                    std::to_string(head_dim) + ", dtype=" + flashtile::dtype_name(dtype) + ")");
}

// softcap and ALiBi slopes (fp32, (nheads,) or (batch, nheads), any
// strides, on `device`) into FwdParams or BwdParams.
template <class Params>
void set_score_mod(Params& p, float softcap, const std::optional<CudaArray>& alibi_slopes, int device) {
  require(softcap >= 0.f && std::isfinite(softcap), "softcap must be a finite number >= 0");
  p.softcap = softcap;
  if (!alibi_slopes) return;
  const CudaArray& a = *alibi_slopes;
  require(is_dtype(a, nb::dlpack::dtype_code::Float, 32), "alibi_slopes must be float32");
  require(a.device_id() == device, "alibi_slopes must be on q's CUDA device");
  const bool per_head = a.ndim() == 1 && static_cast<int>(a.shape(0)) == p.nheads;
  const bool per_batch = a.ndim() == 2 && static_cast<int>(a.shape(0)) == p.batch &&
                         static_cast<int>(a.shape(1)) == p.nheads;
  require(per_head || per_batch, "alibi_slopes must have shape (nheads,) or (batch, nheads)");
  p.alibi_slopes = static_cast<const float*>(a.data());
  p.alibi_slopes_batch_stride = per_batch ? a.stride(0) : 0;
  p.alibi_slopes_head_stride = a.stride(a.ndim() - 1);
}

// dropout_p in [0, 1) and, when above 0, its seed: one int64 on `device`
// (FwdParams::dropout_seed), into FwdParams or BwdParams.
template <class Params>
void set_dropout(Params& p, float dropout_p, const std::optional<CudaArray>& dropout_seed, int device) {
  require(dropout_p >= 0.f && dropout_p < 1.f, "dropout_p must be in [0, 1)");
  p.dropout_p = dropout_p;
  if (dropout_p == 0.f) return;
  require(dropout_seed.has_value(), "dropout_seed is required when dropout_p > 0");
  const CudaArray& seed = *dropout_seed;
  require(is_dtype(seed, nb::dlpack::dtype_code::Int, 64) && seed.ndim() == 1 && seed.shape(0) == 1,
          "dropout_seed must be an int64 array of shape (1,)");
  require(seed.device_id() == device, "dropout_seed must be on q's CUDA device");
  p.dropout_seed = static_cast<const int64_t*>(seed.data());
}

// The testing-only probabilities: q's dtype, contiguous (batch, nheads,
// rows, cols) with rows >= seqlen_q and cols >= seqlen_k (the maxima when
// varlen). Call after set_varlen.
void set_attn_probs(flashtile::FwdParams& p, const std::optional<CudaArray>& attn_probs, int device) {
  if (!attn_probs) return;
  const CudaArray& a = *attn_probs;
  require(element_dtype(a, "attn_probs") == p.dtype, "attn_probs must have q's dtype");
  require(a.device_id() == device, "attn_probs must be on q's CUDA device");
  require(a.ndim() == 4 && int64_t(a.shape(0)) == p.batch && int64_t(a.shape(1)) == p.nheads &&
              int64_t(a.shape(2)) >= p.seqlen_q && int64_t(a.shape(3)) >= p.seqlen_k,
          "attn_probs must have shape (batch, nheads, rows >= seqlen_q, cols >= seqlen_k)");
  require(a.stride(3) == 1 && a.stride(2) == int64_t(a.shape(3)) && a.stride(1) == int64_t(a.shape(2) * a.shape(3)) &&
              a.stride(0) == int64_t(a.shape(1) * a.shape(2) * a.shape(3)),
          "attn_probs must be contiguous");
  require(a.shape(2) <= 16 * 65535 && a.shape(3) <= (int64_t(1) << 30), "attn_probs is too large");
  p.attn_probs = a.data();
  p.attn_probs_rows = int(a.shape(2));
  p.attn_probs_cols = int(a.shape(3));
}

void fwd(const CudaArray& q, const CudaArray& k, const CudaArray& v, const CudaArray& out,
         const CudaArray& lse, float softmax_scale, bool causal, uintptr_t stream, int window_left,
         int window_right, float softcap, const std::optional<CudaArray>& alibi_slopes,
         const std::optional<CudaArray>& cu_seqlens_q, const std::optional<CudaArray>& cu_seqlens_k,
         const std::optional<CudaArray>& seqused_k, int max_seqlen_q, int max_seqlen_k, float dropout_p,
         const std::optional<CudaArray>& dropout_seed, const std::optional<CudaArray>& attn_probs,
         const std::optional<CudaArray>& tile_counter) {
  const VarlenArgs varlen{cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k};
  const flashtile::DType dtype = element_dtype(q, "q");
  require(element_dtype(k, "k") == dtype && element_dtype(v, "v") == dtype &&
              element_dtype(out, "out") == dtype,
          "q, k, v and out must share one dtype");
  const int device = q.device_id();
  require(k.device_id() == device && v.device_id() == device && out.device_id() == device &&
              lse.device_id() == device,
          "q, k, v, out and lse must be on one CUDA device");
  const Rows4 Q(q, "q", varlen.on()), K(k, "k", varlen.on()), V(v, "v", varlen.on()), O(out, "out", varlen.on());
  require_lse(lse, Q, varlen.on());

  flashtile::FwdParams p;
  p.batch = static_cast<int>(Q.shape(0));
  p.seqlen_q = static_cast<int>(Q.shape(1));
  p.nheads = static_cast<int>(Q.shape(2));
  p.head_dim = static_cast<int>(Q.shape(3));
  p.seqlen_k = static_cast<int>(K.shape(1));
  p.nheads_k = static_cast<int>(K.shape(2));
  for (int i = 0; i < 4; ++i) {
    require(K.shape(i) == V.shape(i), "k and v must have the same shape");
    require(O.shape(i) == Q.shape(i), "out must have q's shape");
  }
  require(K.shape(0) == Q.shape(0), "k must have q's batch size");
  require(K.shape(3) == Q.shape(3), "k must have q's head_dim");

  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.out = out.data();
  p.lse = static_cast<float*>(lse.data());
  Q.strides(p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  K.strides(p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  V.strides(p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  O.strides(p.out_batch_stride, p.out_row_stride, p.out_head_stride);
  p.softmax_scale = softmax_scale;
  p.causal = causal;
  p.window_left = window_left;
  p.window_right = window_right;
  p.dtype = dtype;
  set_varlen(p, varlen, device);
  set_score_mod(p, softcap, alibi_slopes, device);
  set_dropout(p, dropout_p, dropout_seed, device);
  set_attn_probs(p, attn_probs, device);
  if (tile_counter) {
    const CudaArray& c = *tile_counter;
    require(is_dtype(c, nb::dlpack::dtype_code::Int, 32) && c.ndim() == 1 && c.shape(0) == 1,
            "tile_counter must be an int32 array of shape (1,)");
    require(c.device_id() == device, "tile_counter must be on q's CUDA device");
    p.tile_counter = static_cast<int*>(c.data());
  }

  raise_for_status(flashtile::fwd(p, reinterpret_cast<cudaStream_t>(stream)), "fwd", p.head_dim,
                   dtype, flashtile::variant_for(p));
}

size_t bwd_workspace_bytes(int batch, int seqlen_q, int seqlen_k, int nheads, int nheads_k, int head_dim,
                           bool causal, int window_left, int window_right, bool deterministic,
                           int varlen_total_q) {
  flashtile::BwdParams p;
  p.batch = batch, p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k, p.nheads = nheads, p.nheads_k = nheads_k;
  p.head_dim = head_dim, p.causal = causal, p.window_left = window_left, p.window_right = window_right;
  p.deterministic = deterministic;
  if (varlen_total_q >= 0) {
    static const int kAnyOffsets = 0;  // only cu_seqlens_q's presence matters here
    p.cu_seqlens_q = &kAnyOffsets;
    p.total_q = varlen_total_q;
  }
  return flashtile::bwd_workspace_bytes(p);
}

void bwd(const CudaArray& dout, const CudaArray& q, const CudaArray& k, const CudaArray& v,
         const CudaArray& out, const CudaArray& lse, const CudaArray& dq, const CudaArray& dk,
         const CudaArray& dv, const CudaArray& workspace, float softmax_scale, bool causal,
         bool deterministic, uintptr_t stream, int window_left, int window_right, float softcap,
         const std::optional<CudaArray>& alibi_slopes, const std::optional<CudaArray>& cu_seqlens_q,
         const std::optional<CudaArray>& cu_seqlens_k, const std::optional<CudaArray>& seqused_k,
         int max_seqlen_q, int max_seqlen_k, float dropout_p, const std::optional<CudaArray>& dropout_seed) {
  const VarlenArgs varlen{cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k};
  const flashtile::DType dtype = element_dtype(q, "q");
  const std::pair<const CudaArray*, const char*> same_dtype[] = {
      {&k, "k"}, {&v, "v"}, {&out, "out"}, {&dout, "dout"}, {&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}};
  for (const auto& [a, name] : same_dtype) {
    require(element_dtype(*a, name) == dtype,
            std::string(name) + " must have q's dtype (q, k, v, out, dout, dq, dk and dv share one)");
  }
  const int device = q.device_id();
  const CudaArray* all[] = {&k, &v, &out, &dout, &dq, &dk, &dv, &lse, &workspace};
  for (const CudaArray* a : all) {
    require(a->device_id() == device, "all arrays must be on one CUDA device");
  }
  const bool vl = varlen.on();
  const Rows4 Q(q, "q", vl), K(k, "k", vl), V(v, "v", vl), O(out, "out", vl), dO(dout, "dout", vl),
      dQ(dq, "dq", vl), dK(dk, "dk", vl), dV(dv, "dv", vl);
  for (int i = 0; i < 4; ++i) {
    require(K.shape(i) == V.shape(i) && dK.shape(i) == K.shape(i) && dV.shape(i) == K.shape(i),
            "k, v, dk and dv must have the same shape");
    require(O.shape(i) == Q.shape(i) && dO.shape(i) == Q.shape(i) && dQ.shape(i) == Q.shape(i),
            "out, dout and dq must have q's shape");
  }
  require(K.shape(0) == Q.shape(0) && K.shape(3) == Q.shape(3),
          "k must have q's batch size and head_dim");
  require_lse(lse, Q, vl);
  require(workspace.ndim() == 1 && workspace.stride(0) == 1, "workspace must be a contiguous 1-D array");

  flashtile::BwdParams p;
  p.batch = static_cast<int>(Q.shape(0));
  p.seqlen_q = static_cast<int>(Q.shape(1));
  p.nheads = static_cast<int>(Q.shape(2));
  p.head_dim = static_cast<int>(Q.shape(3));
  p.seqlen_k = static_cast<int>(K.shape(1));
  p.nheads_k = static_cast<int>(K.shape(2));
  p.deterministic = deterministic;
  p.causal = causal;  // with the window, decides the split tail's share of the workspace
  p.window_left = window_left;
  p.window_right = window_right;
  set_varlen(p, varlen, device);
  require(workspace.nbytes() >= flashtile::bwd_workspace_bytes(p),
          "workspace is smaller than bwd_workspace_bytes()");
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = out.data(), p.dout = dout.data();
  p.lse = static_cast<const float*>(lse.data());
  p.dq = dq.data(), p.dk = dk.data(), p.dv = dv.data(), p.workspace = workspace.data();
  Q.strides(p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  K.strides(p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  V.strides(p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  O.strides(p.out_batch_stride, p.out_row_stride, p.out_head_stride);
  dO.strides(p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride);
  dQ.strides(p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  dK.strides(p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  dV.strides(p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  p.softmax_scale = softmax_scale;
  p.dtype = dtype;
  set_score_mod(p, softcap, alibi_slopes, device);
  set_dropout(p, dropout_p, dropout_seed, device);
  raise_for_status(flashtile::bwd(p, reinterpret_cast<cudaStream_t>(stream)), "bwd", p.head_dim,
                   dtype, flashtile::variant_for(p));
}

// The split count kvcache() will use for these shapes on the current GPU
// (num_splits = 0: its choice) and the workspace bytes that needs; page_size
// 0 for a dense cache.
std::tuple<int, int64_t> kvcache_plan(int batch, int seqlen_q, int nheads, int nheads_k, int head_dim,
                                      int seqlen_k, int num_splits, int page_size, bool fp16) {
  flashtile::KvCacheParams p;
  p.batch = batch, p.seqlen_q = seqlen_q, p.nheads = nheads, p.nheads_k = nheads_k, p.head_dim = head_dim;
  p.seqlen_k = seqlen_k, p.num_splits = num_splits;
  p.dtype = fp16 ? flashtile::DType::kFp16 : flashtile::DType::kBf16;
  require(batch >= 1 && seqlen_q >= 1 && nheads_k >= 1 && nheads % nheads_k == 0 && seqlen_k >= 0 && page_size >= 0,
          "kvcache_plan: invalid shapes");
  require(num_splits >= 0 && num_splits <= flashtile::kMaxKvCacheSplits,
          "num_splits must be in [0, " + std::to_string(flashtile::kMaxKvCacheSplits) + "]");
  // The planner reads no table: it only asks whether the cache is paged.
  static const int kPagedPlan = 0;
  if (page_size > 0) p.block_table = &kPagedPlan, p.page_size = page_size;
  const int splits = flashtile::resolve_kvcache_splits(p);
  p.num_splits = splits;
  return {splits, flashtile::kvcache_workspace_bytes(p)};
}

// A paged cache's block_table (batch, max_pages) of int32 page indices, rows
// contiguous, on `device` (the device of the array named `device_owner`):
// sets p's block_table, its batch stride, page_size and seqlen_k (the keys
// max_pages pages hold). KvCacheParams and KvAppendParams.
template <class Params>
void set_block_table(Params& p, const CudaArray& t, int64_t page_size, int device, const char* device_owner) {
  require(is_dtype(t, nb::dlpack::dtype_code::Int, 32) && t.ndim() == 2 && int64_t(t.shape(0)) == p.batch,
          "block_table must be int32 (batch, max_pages)");
  require(t.shape(1) <= 1 || t.stride(1) == 1, "block_table's rows must be contiguous");
  require(t.device_id() == device, std::string("block_table must be on ") + device_owner + "'s CUDA device");
  require(int64_t(t.shape(1)) * page_size <= (int64_t(1) << 29), "block_table: the cache holds too many keys");
  p.block_table = static_cast<const int*>(t.data());
  p.block_table_batch_stride = t.stride(0);
  p.page_size = int(page_size);
  p.seqlen_k = int(int64_t(t.shape(1)) * page_size);
}

// Attention of q (batch, seqlen_q, nheads, d) against a dense (batch_cache,
// seqlen_cache, nheads_k, d) or paged (num_pages, page_size, nheads_k, d)
// cache; see flashtile/kvcache_params.hpp.
void kvcache(const CudaArray& q, const CudaArray& k_cache, const CudaArray& v_cache, const CudaArray& out,
             const CudaArray& lse, const std::optional<CudaArray>& workspace, float softmax_scale, bool causal,
             uintptr_t stream, int window_left, int window_right, float softcap,
             const std::optional<CudaArray>& alibi_slopes, const std::optional<CudaArray>& cache_seqlens,
             const std::optional<CudaArray>& cache_leftpad, const std::optional<CudaArray>& cache_batch_idx,
             const std::optional<CudaArray>& block_table, int num_splits) {
  const flashtile::DType dtype = element_dtype(q, "q");
  require(element_dtype(k_cache, "k_cache") == dtype && element_dtype(v_cache, "v_cache") == dtype &&
              element_dtype(out, "out") == dtype,
          "q, k_cache, v_cache and out must share one dtype");
  const int device = q.device_id();
  require(k_cache.device_id() == device && v_cache.device_id() == device && out.device_id() == device &&
              lse.device_id() == device,
          "q, k_cache, v_cache, out and lse must be on one CUDA device");
  const Rows4 Q(q, "q", false), K(k_cache, "k_cache", false), V(v_cache, "v_cache", false), O(out, "out", false);
  require_lse(lse, Q, false);
  for (int i = 0; i < 4; ++i) {
    require(K.shape(i) == V.shape(i), "k_cache and v_cache must have the same shape");
    require(O.shape(i) == Q.shape(i), "out must have q's shape");
  }
  require(K.shape(3) == Q.shape(3), "k_cache must have q's head_dim");

  flashtile::KvCacheParams p;
  p.batch = int(Q.shape(0)), p.seqlen_q = int(Q.shape(1)), p.nheads = int(Q.shape(2)), p.head_dim = int(Q.shape(3));
  p.nheads_k = int(K.shape(2));
  p.q = q.data(), p.k_cache = k_cache.data(), p.v_cache = v_cache.data(), p.out = out.data();
  p.lse = static_cast<float*>(lse.data());
  Q.strides(p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  K.strides(p.k_page_stride, p.k_row_stride, p.k_head_stride);
  V.strides(p.v_page_stride, p.v_row_stride, p.v_head_stride);
  O.strides(p.out_batch_stride, p.out_row_stride, p.out_head_stride);
  if (block_table) {
    set_block_table(p, *block_table, K.shape(1), device, "q");
  } else {
    p.seqlen_k = int(K.shape(1));
  }
  auto vector = [&](const std::optional<CudaArray>& a, const char* name) -> const int* {
    if (!a) return nullptr;
    require_int32_vector(*a, name, p.batch, device);
    return static_cast<const int*>(a->data());
  };
  p.cache_seqlens = vector(cache_seqlens, "cache_seqlens");
  p.cache_leftpad = vector(cache_leftpad, "cache_leftpad");
  p.cache_batch_idx = vector(cache_batch_idx, "cache_batch_idx");
  require(!(block_table && cache_batch_idx), "cache_batch_idx: not with a paged cache");
  require(block_table || cache_batch_idx || K.shape(0) >= p.batch,
          "k_cache holds fewer sequences than q's batch");
  p.softmax_scale = softmax_scale;
  p.causal = causal;
  p.window_left = window_left;
  p.window_right = window_right;
  p.dtype = dtype;
  p.num_splits = num_splits;
  set_score_mod(p, softcap, alibi_slopes, device);
  const int64_t need = flashtile::kvcache_workspace_bytes(p);
  if (need > 0) {
    require(workspace.has_value() && workspace->ndim() == 1 && workspace->stride(0) == 1 &&
                int64_t(workspace->nbytes()) >= need && workspace->device_id() == device,
            "workspace must be a contiguous 1-D array of kvcache_plan()'s bytes on q's device");
    p.workspace = workspace->data();
  }
  const flashtile::Status status = flashtile::kvcache(p, reinterpret_cast<cudaStream_t>(stream));
  if (status == flashtile::Status::kNotBuilt) {
    throw std::runtime_error("flashtile.kvcache: the kernel for head_dim=" + std::to_string(p.head_dim) +
                             ", dtype=" + flashtile::dtype_name(dtype) + " is not built in this flashtile build");
  }
  raise_for_status(status, "kvcache", p.head_dim, dtype, flashtile::Variant::kPlain);
}

// A 4-D array's dims and strides (elements), any strides.
struct Dims4 {
  int64_t shape[4];
  int64_t stride[4];
  Dims4(const CudaArray& a, const char* name) {
    require(a.ndim() == 4, std::string(name) + " must be 4-D");
    for (int i = 0; i < 4; ++i) shape[i] = int64_t(a.shape(i)), stride[i] = a.stride(i);
  }
};

// flash_attn_with_kvcache's new k, v (batch, seqlen_new, nheads_k, d) written
// into the cache (dense or paged, as kvcache()'s) at cache_seqlens, k rotated
// with rotary_cos / rotary_sin when given, and q rotated into q_out; see
// flashtile/kvcache_params.hpp (KvAppendParams).
void kvcache_append(const CudaArray& k_cache, const CudaArray& v_cache, const CudaArray& cache_seqlens,
                    uintptr_t stream, const std::optional<CudaArray>& k, const std::optional<CudaArray>& v,
                    const std::optional<CudaArray>& cache_seqlens_out,
                    const std::optional<CudaArray>& cache_batch_idx, const std::optional<CudaArray>& block_table,
                    const std::optional<CudaArray>& q, const std::optional<CudaArray>& q_out,
                    bool q_rows_share_position, const std::optional<CudaArray>& rotary_cos,
                    const std::optional<CudaArray>& rotary_sin, bool rotary_interleaved) {
  const flashtile::DType dtype = element_dtype(k_cache, "k_cache");
  require(element_dtype(v_cache, "v_cache") == dtype, "k_cache and v_cache must share one dtype");
  const int device = k_cache.device_id();
  const Dims4 K(k_cache, "k_cache"), V(v_cache, "v_cache");
  for (int i = 0; i < 4; ++i) require(K.shape[i] == V.shape[i], "k_cache and v_cache must have the same shape");
  require(v_cache.device_id() == device && cache_seqlens.device_id() == device,
          "k_cache, v_cache and cache_seqlens must be on one CUDA device");
  require(is_dtype(cache_seqlens, nb::dlpack::dtype_code::Int, 32) && cache_seqlens.ndim() == 1,
          "cache_seqlens must be a 1-D int32 array");

  flashtile::KvAppendParams p;
  p.batch = int(cache_seqlens.shape(0));
  p.nheads_k = int(K.shape[2]);
  p.head_dim = int(K.shape[3]);
  p.dtype = dtype;
  p.k_cache = k_cache.data(), p.v_cache = v_cache.data();
  p.k_page_stride = K.stride[0], p.k_cache_row_stride = K.stride[1], p.k_cache_head_stride = K.stride[2];
  p.k_cache_dim_stride = K.stride[3];
  p.v_page_stride = V.stride[0], p.v_cache_row_stride = V.stride[1], p.v_cache_head_stride = V.stride[2];
  p.v_cache_dim_stride = V.stride[3];
  auto vector = [&](const std::optional<CudaArray>& a, const char* name) {
    if (a) require_int32_vector(*a, name, p.batch, device);
    return a ? a->data() : nullptr;
  };
  require_int32_vector(cache_seqlens, "cache_seqlens", p.batch, device);
  p.cache_seqlens = static_cast<const int*>(cache_seqlens.data());
  p.cache_seqlens_out = static_cast<int*>(vector(cache_seqlens_out, "cache_seqlens_out"));
  p.cache_batch_idx = static_cast<const int*>(vector(cache_batch_idx, "cache_batch_idx"));
  if (block_table) {
    set_block_table(p, *block_table, K.shape[1], device, "k_cache");
  } else {
    require(K.shape[1] <= (int64_t(1) << 29), "k_cache holds too many keys");
    p.seqlen_k = int(K.shape[1]);
  }
  require(k.has_value() == v.has_value(), "k and v must be given together");
  if (k) {
    require(element_dtype(*k, "k") == dtype && element_dtype(*v, "v") == dtype, "k and v must have k_cache's dtype");
    require(k->device_id() == device && v->device_id() == device, "k and v must be on k_cache's CUDA device");
    const Dims4 Kn(*k, "k"), Vn(*v, "v");
    for (int i = 0; i < 4; ++i) require(Kn.shape[i] == Vn.shape[i], "k and v must have the same shape");
    require(Kn.shape[0] == p.batch && Kn.shape[2] == p.nheads_k && Kn.shape[3] == p.head_dim,
            "k must be (batch, seqlen_new, nheads_k, head_dim) of the cache's nheads_k and head_dim");
    p.k = k->data(), p.v = v->data();
    p.seqlen_new = int(Kn.shape[1]);
    p.k_batch_stride = Kn.stride[0], p.k_row_stride = Kn.stride[1], p.k_head_stride = Kn.stride[2];
    p.k_dim_stride = Kn.stride[3];
    p.v_batch_stride = Vn.stride[0], p.v_row_stride = Vn.stride[1], p.v_head_stride = Vn.stride[2];
    p.v_dim_stride = Vn.stride[3];
  }
  require(rotary_cos.has_value() == rotary_sin.has_value(), "rotary_cos and rotary_sin must be given together");
  if (rotary_cos) {
    const CudaArray& c = *rotary_cos;
    const CudaArray& s = *rotary_sin;
    const bool fp32 = is_dtype(c, nb::dlpack::dtype_code::Float, 32);
    require(fp32 || (c.dtype() == k_cache.dtype()), "rotary_cos must be float32 or the cache's dtype");
    require(s.dtype() == c.dtype() && s.ndim() == 2 && c.ndim() == 2 && s.shape(0) == c.shape(0) &&
                s.shape(1) == c.shape(1) && s.stride(0) == c.stride(0) && s.stride(1) == c.stride(1),
            "rotary_sin must have rotary_cos's dtype, shape and strides");
    require(c.device_id() == device && s.device_id() == device, "rotary_cos and rotary_sin must be on k_cache's device");
    p.rotary_cos = c.data(), p.rotary_sin = s.data();
    p.rotary_fp32 = fp32;
    p.rotary_interleaved = rotary_interleaved;
    p.seqlen_ro = int(c.shape(0));
    p.rotary_dim = int(2 * c.shape(1));
    p.rotary_row_stride = c.stride(0), p.rotary_col_stride = c.stride(1);
  }
  require(q.has_value() == q_out.has_value(), "q and q_out must be given together");
  if (q) {
    require(element_dtype(*q, "q") == dtype && element_dtype(*q_out, "q_out") == dtype, "q must have the cache's dtype");
    require(q->device_id() == device && q_out->device_id() == device, "q and q_out must be on k_cache's device");
    const Dims4 Q(*q, "q"), Qo(*q_out, "q_out");
    for (int i = 0; i < 4; ++i) require(Q.shape[i] == Qo.shape[i], "q_out must have q's shape");
    require(Q.shape[0] == p.batch && Q.shape[3] == p.head_dim, "q must be (batch, seqlen_q, nheads, head_dim)");
    require(Qo.stride[3] == 1, "q_out must have a contiguous last dim");
    p.q = q->data(), p.q_out = q_out->data();
    p.seqlen_q = int(Q.shape[1]), p.nheads = int(Q.shape[2]);
    p.q_batch_stride = Q.stride[0], p.q_row_stride = Q.stride[1], p.q_head_stride = Q.stride[2];
    p.q_dim_stride = Q.stride[3];
    p.q_out_batch_stride = Qo.stride[0], p.q_out_row_stride = Qo.stride[1], p.q_out_head_stride = Qo.stride[2];
    p.q_rows_share_position = q_rows_share_position;
  }
  const flashtile::Status status = flashtile::kvcache_append(p, reinterpret_cast<cudaStream_t>(stream));
  if (status == flashtile::Status::kNotBuilt) {
    throw std::runtime_error(std::string("flashtile.kvcache_append: the kernel for dtype ") +
                             flashtile::dtype_name(dtype) + " is not built in this flashtile build");
  }
  raise_for_status(status, "kvcache_append", p.head_dim, dtype, flashtile::Variant::kPlain);
}

std::vector<std::tuple<int, std::string>> built_kvcache_kernels() {
  std::vector<std::tuple<int, std::string>> out;
  for (const auto& e : flashtile::KvCacheRegistry::instance().entries()) {
    out.emplace_back(e.head_dim, flashtile::dtype_name(e.dtype));
  }
  return out;
}

// (direction, arch, head_dim, dtype, variant) of each key, by name.
using KeyRow = std::tuple<std::string, std::string, int, std::string, std::string>;
std::vector<KeyRow> key_rows(const std::vector<flashtile::KernelKey>& keys) {
  std::vector<KeyRow> out;
  for (const flashtile::KernelKey& key : keys) {
    out.emplace_back(flashtile::direction_name(key.direction), flashtile::arch_name(key.arch),
                     key.head_dim, flashtile::dtype_name(key.dtype), flashtile::variant_name(key.variant));
  }
  return out;
}

std::vector<KeyRow> built_kernels() { return key_rows(flashtile::KernelRegistry::instance().keys()); }

// The instantiations built without code for compute capability 9.0
// (registry.hpp's keys_without_sm90_code).
std::vector<KeyRow> kernels_without_sm90_code() {
  return key_rows(flashtile::KernelRegistry::instance().keys_without_sm90_code());
}

// (direction, head_dim, dtype, variant, needs KB, tuned-for KB, sm90 code)
// for each SM80-path launcher: the shared memory per block its kernels
// need, the budget its tiles were chosen for (smem_budget.hpp,
// registry.hpp), and whether they have code for compute capability 9.0.
using LauncherBudgetRow = std::tuple<std::string, int, std::string, std::string, int, int, bool>;
std::vector<LauncherBudgetRow> built_smem_budgets() {
  std::vector<LauncherBudgetRow> out;
  const flashtile::KernelRegistry& registry = flashtile::KernelRegistry::instance();
  for (const flashtile::KernelKey& key : registry.keys()) {
    if (key.arch != flashtile::Arch::kSm80) continue;
    for (const flashtile::KernelRegistry::LauncherBudget& budget : registry.budgets(key)) {
      out.emplace_back(flashtile::direction_name(key.direction), key.head_dim, flashtile::dtype_name(key.dtype),
                       flashtile::variant_name(key.variant), flashtile::smem_budget_kb(budget.needs),
                       flashtile::smem_budget_kb(budget.tuned_for), budget.sm90_code);
    }
  }
  return out;
}

// FLASHTILE_SMEM_BUDGETS of the build (CMakeLists.txt), as KB.
std::vector<int> smem_budgets_built() {
  std::vector<int> out;
  const std::string csv = FLASHTILE_SMEM_BUDGETS_BUILT;
  size_t begin = 0;
  while (begin < csv.size()) {
    const size_t end = std::min(csv.find(',', begin), csv.size());
    out.push_back(std::stoi(csv.substr(begin, end - begin)));
    begin = end + 1;
  }
  return out;
}

void limit_smem_budget(int kb) {
  using flashtile::SmemBudget;
  require(kb == 99 || kb == 163 || kb == 227, "limit_smem_budget takes 99, 163 or 227 (KB)");
  flashtile::KernelRegistry::instance().limit_smem(kb == 99 ? SmemBudget::k99KB
                                                   : kb == 163 ? SmemBudget::k163KB
                                                               : SmemBudget::k227KB);
}

void limit_dispatch_arch(const std::string& highest) {
  require(highest == "sm80" || highest == "sm90", "limit_dispatch_arch takes \"sm80\" or \"sm90\"");
  flashtile::KernelRegistry::instance().limit_arch(highest == "sm80" ? flashtile::Arch::kSm80
                                                                     : flashtile::Arch::kSm90);
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "flashtile's compiled kernels (DLPack in, no libtorch)";
  m.def("fwd", &fwd, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
        nb::arg("softmax_scale"), nb::arg("causal"), nb::arg("stream"), nb::arg("window_left") = -1,
        nb::arg("window_right") = -1, nb::arg("softcap") = 0.f, nb::arg("alibi_slopes").none() = nb::none(),
        nb::arg("cu_seqlens_q").none() = nb::none(), nb::arg("cu_seqlens_k").none() = nb::none(),
        nb::arg("seqused_k").none() = nb::none(), nb::arg("max_seqlen_q") = 0, nb::arg("max_seqlen_k") = 0,
        nb::arg("dropout_p") = 0.f, nb::arg("dropout_seed").none() = nb::none(),
        nb::arg("attn_probs").none() = nb::none(), nb::arg("tile_counter").none() = nb::none(),
        "Attention forward into caller-allocated out (batch, seqlen_q, nheads, head_dim) and "
        "lse (batch, nheads, seqlen_q) fp32, on the given cudaStream_t of the current device. "
        "window_left/right: a sliding window (FwdParams), -1 for unbounded. softcap > 0, "
        "alibi_slopes (fp32, (nheads,) or (batch, nheads)) and dropout_p > 0 (with dropout_seed, "
        "int64 (1,), the Philox key) run the scoremod kernels. With "
        "cu_seqlens_q/k (int32, batch + 1): a variable-length batch, q/k/v/out (total, nheads, "
        "head_dim), lse (nheads, total_q), max_seqlen_q/k the longest sequences, seqused_k (int32, "
        "batch) the keys each sequence uses. attn_probs (testing only; q's dtype, contiguous "
        "(batch, nheads, rows >= seqlen_q, cols >= seqlen_k)) also receives the probabilities, "
        "dropped ones negated. tile_counter (int32 (1,), overwritten): lets the sm90 forward "
        "hand out uneven tiles (causal, windows, varlen) on a persistent grid.");
  m.def("bwd", &bwd, nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("workspace"),
        nb::arg("softmax_scale"), nb::arg("causal"), nb::arg("deterministic"), nb::arg("stream"),
        nb::arg("window_left") = -1, nb::arg("window_right") = -1, nb::arg("softcap") = 0.f,
        nb::arg("alibi_slopes").none() = nb::none(), nb::arg("cu_seqlens_q").none() = nb::none(),
        nb::arg("cu_seqlens_k").none() = nb::none(), nb::arg("seqused_k").none() = nb::none(),
        nb::arg("max_seqlen_q") = 0, nb::arg("max_seqlen_k") = 0, nb::arg("dropout_p") = 0.f,
        nb::arg("dropout_seed").none() = nb::none(),
        "Attention backward into caller-allocated dq (q's shape), dk and dv (k's shape), "
        "using a device workspace of bwd_workspace_bytes(...) bytes. deterministic: sum dq in "
        "a fixed order (bitwise reproducible) instead of with atomic adds. dropout_p and "
        "dropout_seed must be the forward's.");
  m.def("bwd_workspace_bytes", &bwd_workspace_bytes, nb::arg("batch"), nb::arg("seqlen_q"),
        nb::arg("seqlen_k"), nb::arg("nheads"), nb::arg("nheads_k"), nb::arg("head_dim"), nb::arg("causal"),
        nb::arg("window_left"), nb::arg("window_right"), nb::arg("deterministic"),
        nb::arg("varlen_total_q") = -1,
        "Bytes of device workspace the backward needs (fp32 dQ accumulator, deterministic "
        "mode's dQ turn counters, the split tail's dK/dV accumulator without a mask, and row sums); "
        "varlen_total_q >= 0: a variable-length batch of that many query rows (seqlen_q and "
        "seqlen_k its longest sequences').");
  m.def("kvcache", &kvcache, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("out"), nb::arg("lse"),
        nb::arg("workspace").none(), nb::arg("softmax_scale"), nb::arg("causal"), nb::arg("stream"),
        nb::arg("window_left") = -1, nb::arg("window_right") = -1, nb::arg("softcap") = 0.f,
        nb::arg("alibi_slopes").none() = nb::none(), nb::arg("cache_seqlens").none() = nb::none(),
        nb::arg("cache_leftpad").none() = nb::none(), nb::arg("cache_batch_idx").none() = nb::none(),
        nb::arg("block_table").none() = nb::none(), nb::arg("num_splits") = 0,
        "Attention of q (batch, seqlen_q, nheads, head_dim) against a KV cache, dense (batch_cache, "
        "seqlen_cache, nheads_k, head_dim) or paged (num_pages, page_size, nheads_k, head_dim) with "
        "block_table (int32 (batch, max_pages)), into caller-allocated out (q's shape) and lse (batch, "
        "nheads, seqlen_q) fp32. cache_seqlens (int32 (batch,)): keys each sequence uses (the cache's "
        "capacity when None); cache_leftpad (int32 (batch,)): where they start; cache_batch_idx (int32 "
        "(batch,)): a dense cache's entry per sequence. num_splits: split-KV CTAs per (batch, KV head), "
        "0 to choose; with more than one, workspace holds kvcache_plan()'s bytes. Reads no device value "
        "on the host (CUDA-graph capturable).");
  m.def("kvcache_append", &kvcache_append, nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("cache_seqlens"),
        nb::arg("stream"), nb::arg("k").none() = nb::none(), nb::arg("v").none() = nb::none(),
        nb::arg("cache_seqlens_out").none() = nb::none(), nb::arg("cache_batch_idx").none() = nb::none(),
        nb::arg("block_table").none() = nb::none(), nb::arg("q").none() = nb::none(),
        nb::arg("q_out").none() = nb::none(), nb::arg("q_rows_share_position") = false,
        nb::arg("rotary_cos").none() = nb::none(), nb::arg("rotary_sin").none() = nb::none(),
        nb::arg("rotary_interleaved") = false,
        "One kernel ahead of kvcache(): new k and v (batch, seqlen_new, nheads_k, head_dim) written into "
        "the cache (dense or paged, as kvcache()'s) at rows cache_seqlens[b] + i (rows past what an entry "
        "holds are skipped), k rotated when rotary_cos and rotary_sin ((seqlen_ro, rotary_dim / 2), "
        "float32 or the cache's dtype) are given, and q rotated into q_out (row i at position "
        "cache_seqlens[b] + i, or cache_seqlens[b] with q_rows_share_position); cache_seqlens_out gets "
        "cache_seqlens + seqlen_new. Reads no device value on the host.");
  m.def("kvcache_plan", &kvcache_plan, nb::arg("batch"), nb::arg("seqlen_q"), nb::arg("nheads"),
        nb::arg("nheads_k"), nb::arg("head_dim"), nb::arg("seqlen_k"), nb::arg("num_splits"),
        nb::arg("page_size") = 0, nb::arg("fp16") = false,
        "(num_splits, workspace bytes) kvcache() uses for these shapes on the current GPU; seqlen_k is "
        "the keys a sequence's cache can hold, page_size its pages' rows (0: dense), fp16 the dtype "
        "(else bf16).");
  m.def("built_kvcache_kernels", &built_kvcache_kernels,
        "The (head_dim, dtype) KV-cache kernels this build contains.");
  m.def("limit_dispatch_arch", &limit_dispatch_arch, nb::arg("highest"),
        "Tests and benchmarks only: \"sm80\" makes every call run the sm80 (mma.sync) path's "
        "kernels, even where an sm90 (wgmma) kernel is built and the GPU runs it; \"sm90\" (the "
        "default) lifts the limit. Process-wide.");
  m.def("limit_smem_budget", &limit_smem_budget, nb::arg("kb"),
        "Tests and benchmarks only: dispatch as if the GPU offered at most kb KB of shared memory "
        "per block (99: sm86/sm89/sm120, 163: A100), running the sm80 path's tiles for that budget "
        "and no sm90 kernel; 227 (the default) lifts the limit. Process-wide.");
  m.def("built_smem_budgets", &built_smem_budgets,
        "(direction, head_dim, dtype, variant, needs_kb, tuned_kb, sm90_code) for each sm80-path "
        "instantiation: the shared memory per block its kernels need, the budget (the GPU class) its tiles "
        "were chosen for (the dispatch prefers the one tuned for the GPU's budget), and whether its kernels "
        "have code for compute capability 9.0.");
  m.attr("smem_budgets_built") = nb::cast(smem_budgets_built());
  m.def("built_kernels", &built_kernels,
        "The (direction, arch, head_dim, dtype, variant) instantiations this build contains.");
  m.def("kernels_without_sm90_code", &kernels_without_sm90_code,
        "The built_kernels() entries compiled without code for compute capability 9.0: in a build with "
        "90a, the sm80 kernels that an H100/H200 does not run, the forward's and the plain backward's "
        "(FLASHTILE_SM80_ON_SM90 builds them for it).");
}
