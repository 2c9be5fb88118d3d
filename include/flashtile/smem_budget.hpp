// The shared memory per block a GPU lets one kernel use (the opt-in limit),
// in the three sizes of the GPUs flashtile runs on:
//   99 KB   sm86, sm89, sm120, sm121 (RTX 30/40/50, A10, A40, L4, L40S)
//   163 KB  sm80, sm87 (A100, A30, Orin)
//   227 KB  sm90, sm100 (H100, H200, B200)
// The budget also names the class of GPU: the 99 KB ones are the consumer
// and workstation parts. The SM80 path's tile configurations come per
// budget (sm80/fwd_traits.hpp, sm80/bwd_traits.hpp): each budget gets the
// default tiles where they fit and suit it, smaller ones where they do not
// fit or spill registers there. The dispatch (flashtile.hpp, registry.hpp)
// runs, for the current GPU, the instantiation tuned for its budget, else
// the one needing the most shared memory within it.
#pragma once

#include "flashtile/device_attribute.hpp"

namespace flashtile {

enum class SmemBudget : int { k99KB = 0, k163KB = 1, k227KB = 2 };

constexpr int smem_budget_bytes(SmemBudget budget) {
  return budget == SmemBudget::k99KB ? 99 * 1024 : budget == SmemBudget::k163KB ? 163 * 1024 : 227 * 1024;
}

constexpr int smem_budget_kb(SmemBudget budget) { return smem_budget_bytes(budget) / 1024; }

// The smallest budget that holds `bytes` (k227KB for anything larger: such a
// kernel fits no GPU, and its launcher says so).
constexpr SmemBudget smem_budget_holding(int bytes) {
  return bytes <= smem_budget_bytes(SmemBudget::k99KB)    ? SmemBudget::k99KB
         : bytes <= smem_budget_bytes(SmemBudget::k163KB) ? SmemBudget::k163KB
                                                          : SmemBudget::k227KB;
}

// The largest budget within `bytes` per block (k99KB below 99 KB too: the
// launchers then refuse with kUnsupportedDevice, as they check the real limit).
constexpr SmemBudget smem_budget_within(int bytes) {
  return bytes >= smem_budget_bytes(SmemBudget::k227KB)   ? SmemBudget::k227KB
         : bytes >= smem_budget_bytes(SmemBudget::k163KB) ? SmemBudget::k163KB
                                                          : SmemBudget::k99KB;
}

// The current GPU's budget; k227KB when the device cannot be queried, so
// that the launch reports the failure.
inline SmemBudget device_smem_budget() {
  const int bytes = cached_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>();
  return bytes > 0 ? smem_budget_within(bytes) : SmemBudget::k227KB;
}

}  // namespace flashtile
