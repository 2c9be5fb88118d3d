// flashtile._C: the nanobind extension. It takes arrays through DLPack
// (nb::ndarray), never links libtorch, checks what it is handed, and calls
// the C++ core, turning a Status into a Python exception.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

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

// The kernels move 16-byte vectors: base pointer and every stride but the
// last (which must be 1) must be multiples of 16 bytes.
void require_vector_aligned(const CudaArray& a, const char* name) {
  require(a.ndim() == 4, std::string(name) + " must be 4-D (batch, seqlen, nheads, head_dim)");
  require(a.stride(3) == 1, std::string(name) + " must have a contiguous last dim (stride 1)");
  require(reinterpret_cast<uintptr_t>(a.data()) % 16 == 0,
          std::string(name) + ": data pointer must be 16-byte aligned");
  for (int i = 0; i < 3; ++i) {
    require(a.stride(i) * 2 % 16 == 0,
            std::string(name) + ": strides of dims 0-2 must be multiples of 16 bytes, got " +
                std::to_string(a.stride(i)) + " elements in dim " + std::to_string(i));
  }
}

void strides_of(const CudaArray& a, int64_t& batch, int64_t& row, int64_t& head) {
  batch = a.stride(0), row = a.stride(1), head = a.stride(2);
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
    throw std::runtime_error(what + "the kernel for head_dim=" + std::to_string(head_dim) +
                             ", dtype=" + flashtile::dtype_name(dtype) + ", variant=" +
                             flashtile::variant_name(variant) + " is not built in this flashtile build");
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

void fwd(const CudaArray& q, const CudaArray& k, const CudaArray& v, const CudaArray& out,
         const CudaArray& lse, float softmax_scale, bool causal, uintptr_t stream, int window_left,
         int window_right, float softcap, const std::optional<CudaArray>& alibi_slopes) {
  const flashtile::DType dtype = element_dtype(q, "q");
  require(element_dtype(k, "k") == dtype && element_dtype(v, "v") == dtype &&
              element_dtype(out, "out") == dtype,
          "q, k, v and out must share one dtype");
  require(is_dtype(lse, nb::dlpack::dtype_code::Float, 32), "lse must be float32");
  const int device = q.device_id();
  require(k.device_id() == device && v.device_id() == device && out.device_id() == device &&
              lse.device_id() == device,
          "q, k, v, out and lse must be on one CUDA device");
  require_vector_aligned(q, "q");
  require_vector_aligned(k, "k");
  require_vector_aligned(v, "v");
  require_vector_aligned(out, "out");

  flashtile::FwdParams p;
  p.batch = static_cast<int>(q.shape(0));
  p.seqlen_q = static_cast<int>(q.shape(1));
  p.nheads = static_cast<int>(q.shape(2));
  p.head_dim = static_cast<int>(q.shape(3));
  p.seqlen_k = static_cast<int>(k.shape(1));
  p.nheads_k = static_cast<int>(k.shape(2));
  for (int i = 0; i < 4; ++i) {
    require(k.shape(i) == v.shape(i), "k and v must have the same shape");
    require(out.shape(i) == q.shape(i), "out must have q's shape");
  }
  require(k.shape(0) == q.shape(0), "k must have q's batch size");
  require(k.shape(3) == q.shape(3), "k must have q's head_dim");
  require(lse.ndim() == 3 && lse.shape(0) == q.shape(0) && lse.shape(1) == q.shape(2) &&
              lse.shape(2) == q.shape(1),
          "lse must have shape (batch, nheads, seqlen_q)");
  require(lse.stride(2) == 1 && lse.stride(1) == static_cast<int64_t>(lse.shape(2)) &&
              lse.stride(0) == static_cast<int64_t>(lse.shape(1) * lse.shape(2)),
          "lse must be contiguous");

  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.out = out.data();
  p.lse = static_cast<float*>(lse.data());
  strides_of(q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  strides_of(k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  strides_of(v, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  strides_of(out, p.out_batch_stride, p.out_row_stride, p.out_head_stride);
  p.softmax_scale = softmax_scale;
  p.causal = causal;
  p.window_left = window_left;
  p.window_right = window_right;
  p.dtype = dtype;
  set_score_mod(p, softcap, alibi_slopes, device);

  raise_for_status(flashtile::fwd(p, reinterpret_cast<cudaStream_t>(stream)), "fwd", p.head_dim,
                   dtype, flashtile::variant_for(p));
}

size_t bwd_workspace_bytes(int batch, int seqlen_q, int nheads, int head_dim, bool deterministic) {
  flashtile::BwdParams p;
  p.batch = batch, p.seqlen_q = seqlen_q, p.nheads = nheads, p.head_dim = head_dim;
  p.deterministic = deterministic;
  return flashtile::bwd_workspace_bytes(p);
}

void bwd(const CudaArray& dout, const CudaArray& q, const CudaArray& k, const CudaArray& v,
         const CudaArray& out, const CudaArray& lse, const CudaArray& dq, const CudaArray& dk,
         const CudaArray& dv, const CudaArray& workspace, float softmax_scale, bool causal,
         bool deterministic, uintptr_t stream, int window_left, int window_right, float softcap,
         const std::optional<CudaArray>& alibi_slopes) {
  const flashtile::DType dtype = element_dtype(q, "q");
  const std::pair<const CudaArray*, const char*> same_dtype[] = {
      {&k, "k"}, {&v, "v"}, {&out, "out"}, {&dout, "dout"}, {&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}};
  for (const auto& [a, name] : same_dtype) {
    require(element_dtype(*a, name) == dtype,
            std::string(name) + " must have q's dtype (q, k, v, out, dout, dq, dk and dv share one)");
  }
  require(is_dtype(lse, nb::dlpack::dtype_code::Float, 32), "lse must be float32");
  const int device = q.device_id();
  const CudaArray* all[] = {&k, &v, &out, &dout, &dq, &dk, &dv, &lse, &workspace};
  for (const CudaArray* a : all) {
    require(a->device_id() == device, "all arrays must be on one CUDA device");
  }
  require_vector_aligned(q, "q");
  require_vector_aligned(k, "k");
  require_vector_aligned(v, "v");
  require_vector_aligned(out, "out");
  require_vector_aligned(dout, "dout");
  require_vector_aligned(dq, "dq");
  require_vector_aligned(dk, "dk");
  require_vector_aligned(dv, "dv");
  for (int i = 0; i < 4; ++i) {
    require(k.shape(i) == v.shape(i) && dk.shape(i) == k.shape(i) && dv.shape(i) == k.shape(i),
            "k, v, dk and dv must have the same shape");
    require(out.shape(i) == q.shape(i) && dout.shape(i) == q.shape(i) && dq.shape(i) == q.shape(i),
            "out, dout and dq must have q's shape");
  }
  require(k.shape(0) == q.shape(0) && k.shape(3) == q.shape(3),
          "k must have q's batch size and head_dim");
  require(lse.ndim() == 3 && lse.shape(0) == q.shape(0) && lse.shape(1) == q.shape(2) &&
              lse.shape(2) == q.shape(1),
          "lse must have shape (batch, nheads, seqlen_q)");
  require(lse.stride(2) == 1 && lse.stride(1) == static_cast<int64_t>(lse.shape(2)) &&
              lse.stride(0) == static_cast<int64_t>(lse.shape(1) * lse.shape(2)),
          "lse must be contiguous");
  require(workspace.ndim() == 1 && workspace.stride(0) == 1, "workspace must be a contiguous 1-D array");

  flashtile::BwdParams p;
  p.batch = static_cast<int>(q.shape(0));
  p.seqlen_q = static_cast<int>(q.shape(1));
  p.nheads = static_cast<int>(q.shape(2));
  p.head_dim = static_cast<int>(q.shape(3));
  p.seqlen_k = static_cast<int>(k.shape(1));
  p.nheads_k = static_cast<int>(k.shape(2));
  p.deterministic = deterministic;
  require(workspace.nbytes() >= flashtile::bwd_workspace_bytes(p),
          "workspace is smaller than bwd_workspace_bytes()");
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = out.data(), p.dout = dout.data();
  p.lse = static_cast<const float*>(lse.data());
  p.dq = dq.data(), p.dk = dk.data(), p.dv = dv.data(), p.workspace = workspace.data();
  strides_of(q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  strides_of(k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  strides_of(v, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  strides_of(out, p.out_batch_stride, p.out_row_stride, p.out_head_stride);
  strides_of(dout, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride);
  strides_of(dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  strides_of(dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  strides_of(dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  p.softmax_scale = softmax_scale;
  p.causal = causal;
  p.window_left = window_left;
  p.window_right = window_right;
  p.dtype = dtype;
  set_score_mod(p, softcap, alibi_slopes, device);
  raise_for_status(flashtile::bwd(p, reinterpret_cast<cudaStream_t>(stream)), "bwd", p.head_dim,
                   dtype, flashtile::variant_for(p));
}

std::vector<std::tuple<std::string, std::string, int, std::string, std::string>> built_kernels() {
  std::vector<std::tuple<std::string, std::string, int, std::string, std::string>> out;
  for (const flashtile::KernelKey& key : flashtile::KernelRegistry::instance().keys()) {
    out.emplace_back(flashtile::direction_name(key.direction), flashtile::arch_name(key.arch),
                     key.head_dim, flashtile::dtype_name(key.dtype), flashtile::variant_name(key.variant));
  }
  return out;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "flashtile's compiled kernels (DLPack in, no libtorch)";
  m.def("fwd", &fwd, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
        nb::arg("softmax_scale"), nb::arg("causal"), nb::arg("stream"), nb::arg("window_left") = -1,
        nb::arg("window_right") = -1, nb::arg("softcap") = 0.f, nb::arg("alibi_slopes").none() = nb::none(),
        "Attention forward into caller-allocated out (batch, seqlen_q, nheads, head_dim) and "
        "lse (batch, nheads, seqlen_q) fp32, on the given cudaStream_t of the current device. "
        "window_left/right: a sliding window (FwdParams), -1 for unbounded. softcap > 0 and "
        "alibi_slopes (fp32, (nheads,) or (batch, nheads)) run the scoremod kernels.");
  m.def("bwd", &bwd, nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("workspace"),
        nb::arg("softmax_scale"), nb::arg("causal"), nb::arg("deterministic"), nb::arg("stream"),
        nb::arg("window_left") = -1, nb::arg("window_right") = -1, nb::arg("softcap") = 0.f,
        nb::arg("alibi_slopes").none() = nb::none(),
        "Attention backward into caller-allocated dq (q's shape), dk and dv (k's shape), "
        "using a device workspace of bwd_workspace_bytes(...) bytes. deterministic: sum dq in "
        "a fixed order (bitwise reproducible) instead of with atomic adds.");
  m.def("bwd_workspace_bytes", &bwd_workspace_bytes, nb::arg("batch"), nb::arg("seqlen_q"),
        nb::arg("nheads"), nb::arg("head_dim"), nb::arg("deterministic"),
        "Bytes of device workspace the backward needs (fp32 dQ accumulator unless "
        "deterministic, and row sums).");
  m.def("built_kernels", &built_kernels,
        "The (direction, arch, head_dim, dtype, variant) instantiations this build contains.");
}
