// The dispatch table: one entry per compiled instantiation, keyed by
// (direction, arch, head dim, dtype, variant). Each generated file in kernels/ adds its
// launcher at static-initialization time; callers ask the table and turn a
// miss into a "not built" error instead of guessing.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "flashtile/params.hpp"
#include "flashtile/status.hpp"

namespace flashtile {

enum class Direction : int { kFwd = 0, kBwd = 1 };
// kSm80 is the mma.sync / cp.async path: it runs on sm80 and every newer arch.
// kSm90 is the wgmma path (sm90/): its sm90a code runs on compute capability
// 9.0 (H100, H200) only, and exists for the plain backward of some head dims.
enum class Arch : int { kSm80 = 0, kSm90 = 1 };

// kScoreMod kernels apply softcap, ALiBi and dropout (common/score_mod.hpp,
// common/dropout.hpp) and write the forward's testing-only attn_probs; kPlain
// kernels have none of them and none of their cost.
enum class Variant : int { kPlain = 0, kScoreMod = 1 };

inline const char* direction_name(Direction d) { return d == Direction::kFwd ? "fwd" : "bwd"; }
inline const char* variant_name(Variant v) { return v == Variant::kPlain ? "plain" : "scoremod"; }
inline const char* arch_name(Arch a) { return a == Arch::kSm80 ? "sm80" : a == Arch::kSm90 ? "sm90" : "?"; }

struct KernelKey {
  Direction direction;
  Arch arch;
  int head_dim;
  DType dtype;
  Variant variant;

  bool operator==(const KernelKey& o) const {
    return direction == o.direction && arch == o.arch && head_dim == o.head_dim &&
           dtype == o.dtype && variant == o.variant;
  }
};

using FwdLauncher = Status (*)(const FwdParams&, cudaStream_t);
using BwdLauncher = Status (*)(const BwdParams&, cudaStream_t);

class KernelRegistry {
 public:
  // Function-local static: safe to call from other translation units' static
  // initializers, whatever order the linker put them in.
  static KernelRegistry& instance() {
    static KernelRegistry registry;
    return registry;
  }

  bool add_fwd(KernelKey key, FwdLauncher launch) {
    fwd_.push_back({key, launch});
    return true;
  }

  FwdLauncher find_fwd(Arch arch, int head_dim, DType dtype, Variant variant) const {
    const KernelKey want{Direction::kFwd, arch, head_dim, dtype, variant};
    for (const FwdEntry& e : fwd_) {
      if (e.key == want) return e.launch;
    }
    return nullptr;
  }

  bool add_bwd(KernelKey key, BwdLauncher launch) {
    bwd_.push_back({key, launch});
    return true;
  }

  BwdLauncher find_bwd(Arch arch, int head_dim, DType dtype, Variant variant) const {
    const KernelKey want{Direction::kBwd, arch, head_dim, dtype, variant};
    for (const BwdEntry& e : bwd_) {
      if (e.key == want) return e.launch;
    }
    return nullptr;
  }

  // A dispatch limit for tests and benchmarks: with kSm80, callers skip the
  // wgmma kernels and run the sm80 path's even on an sm90 device, so that
  // one GPU exercises both paths. Process-wide; not for concurrent callers.
  void limit_arch(Arch highest) { highest_arch_ = highest; }
  bool arch_allowed(Arch arch) const { return static_cast<int>(arch) <= static_cast<int>(highest_arch_); }

  std::vector<KernelKey> keys() const {
    std::vector<KernelKey> out;
    for (const FwdEntry& e : fwd_) out.push_back(e.key);
    for (const BwdEntry& e : bwd_) out.push_back(e.key);
    return out;
  }

 private:
  template <class Launcher>
  struct Entry {
    KernelKey key;
    Launcher launch;
  };
  using FwdEntry = Entry<FwdLauncher>;
  using BwdEntry = Entry<BwdLauncher>;
  std::vector<FwdEntry> fwd_;
  std::vector<BwdEntry> bwd_;
  Arch highest_arch_ = Arch::kSm90;
};

}  // namespace flashtile
