// The KV-cache kernels' dispatch table: one entry per compiled (head dim,
// dtype), each generated kernels/kvcache_sm80_*.cu file adding its launcher at
// static-initialization time, as registry.hpp's for the forward and
// backward. A table of its own because these kernels take KvCacheParams and
// have one family for every arch (the mma.sync kernels, sm80 and newer).
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "flashtile/kvcache_params.hpp"
#include "flashtile/status.hpp"

namespace flashtile {

using KvCacheLauncher = Status (*)(const KvCacheParams&, cudaStream_t);
using KvAppendLauncher = Status (*)(const KvAppendParams&, cudaStream_t);

class KvCacheRegistry {
 public:
  struct Entry {
    int head_dim;
    DType dtype;
    KvCacheLauncher launch;
    int deep_smem_bytes;
  };

  static KvCacheRegistry& instance() {
    static KvCacheRegistry registry;
    return registry;
  }

  // deep_smem_bytes: the shared memory of the kernel's deeper pipeline, 0
  // when it has none (kvcache_params.hpp, kvcache_deep_fits).
  bool add(int head_dim, DType dtype, KvCacheLauncher launch, int deep_smem_bytes) {
    entries_.push_back({head_dim, dtype, launch, deep_smem_bytes});
    return true;
  }

  const Entry* find_entry(int head_dim, DType dtype) const {
    for (const Entry& e : entries_) {
      if (e.head_dim == head_dim && e.dtype == dtype) return &e;
    }
    return nullptr;
  }

  KvCacheLauncher find(int head_dim, DType dtype) const {
    const Entry* e = find_entry(head_dim, dtype);
    return e != nullptr ? e->launch : nullptr;
  }

  // The append kernel (sm80/kvcache_append_kernel.hpp), one per dtype:
  // kernels/kvcache_append_*.cu.
  bool add_append(DType dtype, KvAppendLauncher launch) {
    appends_.push_back({dtype, launch});
    return true;
  }

  KvAppendLauncher find_append(DType dtype) const {
    for (const AppendEntry& e : appends_) {
      if (e.dtype == dtype) return e.launch;
    }
    return nullptr;
  }

  const std::vector<Entry>& entries() const { return entries_; }

 private:
  struct AppendEntry {
    DType dtype;
    KvAppendLauncher launch;
  };
  std::vector<Entry> entries_;
  std::vector<AppendEntry> appends_;
};

}  // namespace flashtile
