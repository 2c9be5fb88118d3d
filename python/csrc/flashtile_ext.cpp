// flashtile._C: the nanobind extension. It takes arrays through DLPack
// (nb::ndarray), never links libtorch, checks what it is handed, and calls
// the C++ core, turning a Status into a Python exception.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
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

void fwd(const CudaArray& q, const CudaArray& k, const CudaArray& v, const CudaArray& out,
         const CudaArray& lse, float softmax_scale, bool causal, uintptr_t stream) {
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
  p.q_batch_stride = q.stride(0), p.q_row_stride = q.stride(1), p.q_head_stride = q.stride(2);
  p.k_batch_stride = k.stride(0), p.k_row_stride = k.stride(1), p.k_head_stride = k.stride(2);
  p.v_batch_stride = v.stride(0), p.v_row_stride = v.stride(1), p.v_head_stride = v.stride(2);
  p.out_batch_stride = out.stride(0), p.out_row_stride = out.stride(1),
  p.out_head_stride = out.stride(2);
  p.softmax_scale = softmax_scale;
  p.causal = causal;
  p.dtype = dtype;

  const flashtile::Status status = flashtile::fwd(p, reinterpret_cast<cudaStream_t>(stream));
  if (status == flashtile::Status::kCudaError) {
    throw std::runtime_error(std::string("flashtile: CUDA error: ") +
                             cudaGetErrorString(cudaGetLastError()));
  }
  if (status == flashtile::Status::kNotBuilt) {  // RuntimeError, like the Python layer's check
    throw std::runtime_error(std::string("flashtile.fwd: the kernel for head_dim=") +
                             std::to_string(p.head_dim) + ", dtype=" +
                             flashtile::dtype_name(dtype) + " is not built in this flashtile build");
  }
  if (status != flashtile::Status::kSuccess) {
    raise_value_error(std::string("flashtile.fwd: ") + flashtile::status_string(status) +
                      " (head_dim=" + std::to_string(p.head_dim) +
                      ", dtype=" + flashtile::dtype_name(dtype) + ")");
  }
}

std::vector<std::tuple<std::string, std::string, int, std::string>> built_kernels() {
  std::vector<std::tuple<std::string, std::string, int, std::string>> out;
  for (const flashtile::KernelKey& key : flashtile::KernelRegistry::instance().keys()) {
    out.emplace_back(flashtile::direction_name(key.direction), flashtile::arch_name(key.arch),
                     key.head_dim, flashtile::dtype_name(key.dtype));
  }
  return out;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "flashtile's compiled kernels (DLPack in, no libtorch)";
  m.def("fwd", &fwd, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
        nb::arg("softmax_scale"), nb::arg("causal"), nb::arg("stream"),
        "Attention forward into caller-allocated out (batch, seqlen_q, nheads, head_dim) and "
        "lse (batch, nheads, seqlen_q) fp32, on the given cudaStream_t of the current device.");
  m.def("built_kernels", &built_kernels,
        "The (direction, arch, head_dim, dtype) instantiations this build contains.");
}
