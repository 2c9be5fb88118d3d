// Status codes returned by every flashtile host entry point. The C++ core never
// throws, aborts or prints: a caller gets a Status and can turn it into text.
#pragma once

namespace flashtile {

enum class Status : int {
  kSuccess = 0,
  kInvalidArgument,     // a size or pointer that no kernel can take (e.g. seqlen 0)
  kMisalignedPointer,   // a base pointer or stride breaks the 16-byte vector access
  kUnsupportedHeadDim,  // no tile configuration exists for this head dim
  kNotBuilt,            // supported, but this build did not instantiate the kernel
  kCudaError,           // a CUDA runtime call failed; cudaGetLastError() says why
  kUnsupportedDevice,   // the current GPU lacks what the kernel needs: shared memory per block, or
                        // (the SM90 path) compute capability 9.0
};

inline const char* status_string(Status s) {
  switch (s) {
    case Status::kSuccess: return "success";
    case Status::kInvalidArgument: return "invalid argument";
    case Status::kMisalignedPointer:
      return "misaligned tensor: base pointers and row/head/batch strides must be "
             "multiples of 16 bytes";
    case Status::kUnsupportedHeadDim: return "unsupported head dim";
    case Status::kNotBuilt: return "kernel not built in this flashtile build";
    case Status::kCudaError: return "CUDA error";
    case Status::kUnsupportedDevice:
      return "the current GPU cannot run this kernel (too little shared memory per block, or not the "
             "compute capability 9.0 that the sm90 kernels need)";
  }
  return "unknown status";
}

}  // namespace flashtile
