// The dispatch table: one entry per compiled instantiation, keyed by
// (direction, arch, head dim, dtype, variant), with the shared memory per
// block its kernels need and the class of GPU its tiles were chosen for
// (smem_budget.hpp). Each generated file in kernels/ adds its launcher at
// static-initialization time; callers ask the table and turn a miss into a
// "not built" error instead of guessing.
#pragma once

#include <cuda_runtime_api.h>

#include <initializer_list>
#include <vector>

#include "flashtile/params.hpp"
#include "flashtile/smem_budget.hpp"
#include "flashtile/status.hpp"

namespace flashtile {

enum class Direction : int { kFwd = 0, kBwd = 1 };
// kSm80 is the mma.sync / cp.async path: it runs on sm80 and newer archs
// (on 9.0 only where its file was compiled for it: add_fwd's sm90_code).
// kSm90 is the wgmma path (sm90/): its sm90a code runs on compute capability
// 9.0 (H100, H200) only.
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

// Whether a list of nvcc's virtual archs (800, 900, ...) holds `arch`.
constexpr bool arch_listed(std::initializer_list<int> archs, int arch) {
  for (int a : archs) {
    if (a == arch) return true;
  }
  return false;
}

// Whether the translation unit being compiled has code for compute
// capability 9.0 (nvcc's __CUDA_ARCH_LIST__ names each virtual arch it
// compiles for: 900 for compute_90 and compute_90a). A kernels/ file passes
// it to add_fwd and add_bwd: the sm80 plain kernels that the wgmma kernels
// replace are built for the other archs only (CMakeLists.txt). A macro, so
// that each file answers for itself. Without nvcc's list: true.
#ifdef __CUDA_ARCH_LIST__
#define FLASHTILE_UNIT_HAS_SM90_CODE (::flashtile::arch_listed({__CUDA_ARCH_LIST__}, 900))
#else
#define FLASHTILE_UNIT_HAS_SM90_CODE true
#endif

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

  // `needs`: the shared memory per block the launcher's kernels use at most
  // (sm80::fwd_smem_needed, sm80::bwd_smem_needed; k227KB for the sm90
  // kernels). `tuned_for`: the GPUs whose budget its tiles were chosen for
  // (the kBudget of run_fwd / run_bwd): a 99 KB GPU's tiles may be smaller
  // than the default's for its registers, not only for its shared memory.
  // One key may have a launcher per tuned_for. `sm90_code`: its kernels
  // have code for compute capability 9.0 (FLASHTILE_UNIT_HAS_SM90_CODE).
  bool add_fwd(KernelKey key, FwdLauncher launch, SmemBudget needs,
               SmemBudget tuned_for = SmemBudget::k227KB, bool sm90_code = true) {
    fwd_.push_back({key, launch, needs, tuned_for, sm90_code});
    return true;
  }

  // The launcher of that key for a GPU with `budget` of shared memory per
  // block: the one tuned for that budget where built; otherwise, of those
  // whose kernels fit, the one needing the most (on a tie the one tuned for
  // the larger GPU: the default tiles). With `sm90_code_only`, only launchers
  // with code for compute capability 9.0. nullptr when none is built or fits.
  FwdLauncher find_fwd(Arch arch, int head_dim, DType dtype, Variant variant,
                       SmemBudget budget = SmemBudget::k227KB, bool sm90_code_only = false) const {
    return find(fwd_, KernelKey{Direction::kFwd, arch, head_dim, dtype, variant}, budget, sm90_code_only);
  }

  bool add_bwd(KernelKey key, BwdLauncher launch, SmemBudget needs,
               SmemBudget tuned_for = SmemBudget::k227KB, bool sm90_code = true) {
    bwd_.push_back({key, launch, needs, tuned_for, sm90_code});
    return true;
  }

  BwdLauncher find_bwd(Arch arch, int head_dim, DType dtype, Variant variant,
                       SmemBudget budget = SmemBudget::k227KB, bool sm90_code_only = false) const {
    return find(bwd_, KernelKey{Direction::kBwd, arch, head_dim, dtype, variant}, budget, sm90_code_only);
  }

  // A dispatch limit for tests and benchmarks: with kSm80, callers skip the
  // wgmma kernels and run the sm80 path's even on an sm90 device, so that
  // one GPU exercises both paths. Process-wide; not for concurrent callers.
  void limit_arch(Arch highest) { highest_arch_ = highest; }
  bool arch_allowed(Arch arch) const { return static_cast<int>(arch) <= static_cast<int>(highest_arch_); }

  // A second limit for tests and benchmarks: dispatch as if the GPU offered
  // at most `budget` of shared memory per block, so that an H100/H200 runs
  // the tiles of the A100 (k163KB) or of 99 KB GPUs (and, below k227KB, no
  // wgmma kernel). Process-wide; not for concurrent callers.
  void limit_smem(SmemBudget budget) { smem_limit_ = budget; }
  SmemBudget smem_limit() const { return smem_limit_; }

  // Each key once, whatever budgets it was built for.
  std::vector<KernelKey> keys() const {
    std::vector<KernelKey> out;
    auto add = [&out](const KernelKey& key) {
      for (const KernelKey& k : out) {
        if (k == key) return;
      }
      out.push_back(key);
    };
    for (const FwdEntry& e : fwd_) add(e.key);
    for (const BwdEntry& e : bwd_) add(e.key);
    return out;
  }

  // Whether any launcher has code for compute capability 9.0: false in a
  // build without 90a (nor sm80 code compiled for 9.0).
  bool has_sm90_code() const {
    for (const FwdEntry& e : fwd_) {
      if (e.sm90_code) return true;
    }
    for (const BwdEntry& e : bwd_) {
      if (e.sm90_code) return true;
    }
    return false;
  }

  // The keys none of whose launchers has code for compute capability 9.0.
  std::vector<KernelKey> keys_without_sm90_code() const {
    std::vector<KernelKey> out;
    for (const KernelKey& key : keys()) {
      bool sm90_code = false;
      for (const FwdEntry& e : fwd_) sm90_code |= e.key == key && e.sm90_code;
      for (const BwdEntry& e : bwd_) sm90_code |= e.key == key && e.sm90_code;
      if (!sm90_code) out.push_back(key);
    }
    return out;
  }

  struct LauncherBudget {
    SmemBudget needs;
    SmemBudget tuned_for;
    bool sm90_code;
  };

  // What each of a key's launchers needs and was tuned for, and whether it
  // has code for compute capability 9.0.
  std::vector<LauncherBudget> budgets(const KernelKey& key) const {
    std::vector<LauncherBudget> out;
    for (const FwdEntry& e : fwd_) {
      if (e.key == key) out.push_back({e.needs, e.tuned_for, e.sm90_code});
    }
    for (const BwdEntry& e : bwd_) {
      if (e.key == key) out.push_back({e.needs, e.tuned_for, e.sm90_code});
    }
    return out;
  }

 private:
  template <class Launcher>
  struct Entry {
    KernelKey key;
    Launcher launch;
    SmemBudget needs;
    SmemBudget tuned_for;
    bool sm90_code;
  };
  using FwdEntry = Entry<FwdLauncher>;
  using BwdEntry = Entry<BwdLauncher>;

  // find_fwd's order: tuned for `budget` first, then the most shared memory
  // needed, then tuned for the larger GPU.
  template <class Launcher>
  static bool preferred(const Entry<Launcher>& a, const Entry<Launcher>& b, SmemBudget budget) {
    const bool a_tuned = a.tuned_for == budget, b_tuned = b.tuned_for == budget;
    if (a_tuned != b_tuned) return a_tuned;
    if (a.needs != b.needs) return b.needs < a.needs;
    return b.tuned_for < a.tuned_for;
  }

  template <class Launcher>
  static Launcher find(const std::vector<Entry<Launcher>>& entries, const KernelKey& want, SmemBudget budget,
                       bool sm90_code_only) {
    const Entry<Launcher>* best = nullptr;
    for (const Entry<Launcher>& e : entries) {
      if (e.key == want && e.needs <= budget && (e.sm90_code || !sm90_code_only) &&
          (best == nullptr || preferred(e, *best, budget))) {
        best = &e;
      }
    }
    return best ? best->launch : nullptr;
  }

  std::vector<FwdEntry> fwd_;
  std::vector<BwdEntry> bwd_;
  Arch highest_arch_ = Arch::kSm90;
  SmemBudget smem_limit_ = SmemBudget::k227KB;
};

}  // namespace flashtile
