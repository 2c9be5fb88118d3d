// The head dims flashtile has kernels for.
#pragma once

namespace flashtile {

// Each has kernels of its own; the backward for 256 needs sm90's shared
// memory (kUnsupportedDevice on sm80), and the forward for 256 sm80's or
// sm90's (not sm86, sm89, sm120).
inline constexpr int kSupportedHeadDims[] = {32, 64, 96, 128, 192, 256};

// The largest of them: a row of any head dim up to it fits the kernels
// that take the head dim at run time (the KV cache's append).
inline constexpr int kMaxHeadDim = kSupportedHeadDims[5];

inline bool is_supported_head_dim(int head_dim) {
  for (int d : kSupportedHeadDims) {
    if (d == head_dim) return true;
  }
  return false;
}

}  // namespace flashtile
