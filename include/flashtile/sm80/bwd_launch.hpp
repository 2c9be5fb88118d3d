// Host launcher for the SM80 backward of one (head dim, dtype): rowsum(dO ∘ O)
// (which also zeroes the fp32 dQ accumulator and the split tail's), then either
//   - the main kernel with dQ atomics, and dQ's conversion (the default;
//     without a mask the main kernel may split its grid's last wave,
//     bwd_tail_split.hpp, and a third kernel writes those key blocks'
//     dK and dV), or
//   - the main kernel for dK and dV only, and the dQ kernel, which sums dQ in
//     a fixed order (params.deterministic, and always for tiles with
//     kDqOwnKernel).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "flashtile/common/bwd_aux_kernels.hpp"
#include "flashtile/common/device.hpp"
#include "flashtile/params.hpp"
#include "flashtile/sm80/bwd_dq_kernel.hpp"
#include "flashtile/sm80/bwd_kernel.hpp"
#include "flashtile/sm80/bwd_kernels_on_sm90.hpp"
#include "flashtile/sm80/bwd_tail_split.hpp"
#include "flashtile/sm80/bwd_traits.hpp"
#include "flashtile/smem_budget.hpp"
#include "flashtile/status.hpp"
#include "flashtile/workspace.hpp"

namespace flashtile::sm80 {

// Opts the kernel in to kSmemBytes of dynamic shared memory and launches it.
template <int kSmemBytes, class Kernel, class... Args>
cudaError_t launch_with_smem(Kernel* kernel, dim3 grid, int threads, cudaStream_t stream,
                             Args... args) {
  if constexpr (kSmemBytes > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (err != cudaSuccess) return err;
  }
  kernel<<<grid, threads, kSmemBytes, stream>>>(args...);
  return cudaPeekAtLastError();  // left set, so the caller can read the cause
}

// The main kernel for a launch of run_bwd_with: dQ by atomics or not (the
// deterministic mode), fixed-length or varlen, with dropout's code or
// without (the modified kernels only; bwd_runs_dropout_kernels).
template <class Traits, MaskKind kMask, bool kAccumulateDq, bool kScoreMod>
auto* dkdv_kernel_for(bool varlen, bool dropout) {
  if constexpr (kScoreMod) {
    if (dropout) {
      return varlen ? &bwd_dkdv_kernel<Traits, kMask, kAccumulateDq, true, true, true>
                    : &bwd_dkdv_kernel<Traits, kMask, kAccumulateDq, true, true, false>;
    }
  }
  return varlen ? &bwd_dkdv_kernel<Traits, kMask, kAccumulateDq, kScoreMod, false, true>
                : &bwd_dkdv_kernel<Traits, kMask, kAccumulateDq, kScoreMod, false, false>;
}

// Only the plain main kernel without a mask splits its tail (on a
// fixed-length batch, with dQ atomics): its CTAs are all alike.
template <class Traits, MaskKind kMask, bool kScoreMod>
constexpr bool kSplitsTail = !Traits::kDqOwnKernel && kBwdTailSplittable<kMask, kScoreMod>;

// The tail split of a launch of `tasks` key blocks.
template <class Traits, MaskKind kMask, bool kScoreMod>
BwdTailSplit tail_split_for(const BwdParams& params, const BwdWorkspace& ws, int tasks) {
  BwdTailSplit no_split;
  no_split.first_task = tasks;
  if constexpr (!kSplitsTail<Traits, kMask, kScoreMod>) {
    return no_split;
  } else {
    if (params.deterministic || is_varlen(params)) return no_split;
    constexpr auto* kKernel = &bwd_dkdv_kernel<Traits, kMask, true, false, false, false>;
    // BwdQueryWalk's iterations without a mask: every query block of each
    // query head of the group.
    const int iterations = params.nheads / params.nheads_k * ceil_div(params.seqlen_q, Traits::kBlockM);
    return plan_bwd_tail_split(tasks, resident_ctas<kKernel, Traits::kNThreads, Traits::kSmemBytes>(), iterations,
                               bwd_dkv_tail_tasks(params), ws.dkv_tail);
  }
}

// The deterministic mode's dQ kernel for a launch: with dropout's code or
// without (the modified kernels only).
template <class DqTraits, MaskKind kMask, bool kScoreMod>
auto* dq_kernel_for(bool dropout) {
  if constexpr (kScoreMod) {
    if (dropout) return &bwd_dq_kernel<DqTraits, kMask, true, true>;
  }
  return &bwd_dq_kernel<DqTraits, kMask, kScoreMod, false>;
}

// The backward with explicit tile traits: Traits for the main kernel,
// DqTraits for the deterministic mode's dQ kernel. kMask must be what
// resolve_mask() makes of params' causal flag and window (else
// kInvalidArgument). Returns kUnsupportedDevice, before any launch, when the
// current GPU's shared memory per block is too small for the kernels.
template <class Traits, class DqTraits, MaskKind kMask, bool kScoreMod = false>
Status run_bwd_with(const BwdParams& params_in, cudaStream_t stream) {
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  static_assert(std::is_same_v<Element, typename DqTraits::Element> && kHeadDim == DqTraits::kHeadDim);
  if (!kScoreMod && uses_score_mod(params_in)) return Status::kInvalidArgument;
  // can_implement_bwd bounds the 1-D grids counting blocks of 64 rows; the
  // small-budget tiles' blocks of 32 can make twice as many.
  if constexpr (std::min({Traits::kBlockM, Traits::kBlockN, DqTraits::kBlockM}) < 64) {
    const int64_t key_blocks = int64_t(ceil_div(params_in.seqlen_k, Traits::kBlockN)) * params_in.nheads_k;
    const int64_t query_blocks =
        int64_t(ceil_div(params_in.seqlen_q, std::min(Traits::kBlockM, DqTraits::kBlockM))) * params_in.nheads;
    if (std::max(key_blocks, query_blocks) * params_in.batch > std::numeric_limits<int>::max()) {
      return Status::kInvalidArgument;
    }
  }
  BwdParams params = params_in;  // with causal folded into the window
  if (resolve_mask(params.causal, params.window_left, params.window_right) != kMask) return Status::kInvalidArgument;
  // dQ from the dQ kernel (the deterministic mode, and tiles whose main
  // kernel would spill with dQ atomics) or from the main kernel's atomics.
  const bool dq_by_kernel = params.deterministic || Traits::kDqOwnKernel;
  // sm86, sm89 and sm120 offer 99 KB per block, sm80 163 KB; checked here
  // so such a GPU gets a named Status instead of a failed launch.
  const Status fits = check_smem_per_block(dq_by_kernel ? std::max(Traits::kSmemBytes, DqTraits::kSmemDqBytes)
                                                        : Traits::kSmemBytes);
  if (fits != Status::kSuccess) return fits;
  const BwdWorkspace ws = bwd_workspace_layout(params, params.workspace);
  const float* dsum = ws.dsum;
  // 1-D grids (the kernels decode block, head, batch); can_implement_bwd
  // keeps them within 2^31 − 1 blocks (a split tail adds fewer blocks than
  // one wave holds).
  const int tasks = ceil_div(params.seqlen_k, Traits::kBlockN) * params.nheads_k * params.batch;
  const BwdTailSplit tail = tail_split_for<Traits, kMask, kScoreMod>(params, ws, tasks);
  const int split_tasks = tasks - tail.first_task;
  const dim3 dkdv_grid(unsigned(tail.grid_blocks(tasks)));

  // ws.dq_accum_bytes is a multiple of 256; without the deterministic mode
  // the split tail's slots follow it, so one range zeroes both. The dQ
  // kernel uses neither.
  const size_t zero_bytes = dq_by_kernel ? 0 : ws.dq_accum_bytes + tail.slot_bytes<Traits::kBlockN, kHeadDim>(tasks);
  if (launch_bwd_rowsum<Element, kHeadDim>(params, ws, zero_bytes, stream) != cudaSuccess) return Status::kCudaError;

  // Fixed-length and variable-length batches run separate instantiations of
  // the main kernel (common/seqlen.hpp says why); the dQ and convert kernels
  // decide at run time.
  const bool varlen = is_varlen(params);
  const bool dropout = kScoreMod && bwd_runs_dropout_kernels(params);  // sm80/bwd_kernels_on_sm90.hpp
  if constexpr (!Traits::kDqOwnKernel) {
    if (!dq_by_kernel) {
      auto* dkdv_kernel = dkdv_kernel_for<Traits, kMask, true, kScoreMod>(varlen, dropout);
      if (launch_with_smem<Traits::kSmemBytes>(dkdv_kernel, dkdv_grid, Traits::kNThreads, stream, params,
                                               ws.dq_accum, dsum, tail) != cudaSuccess) {
        return Status::kCudaError;
      }
      const dim3 convert_grid(unsigned(ceil_div(params.seqlen_q, Traits::kBlockM) * params.nheads * params.batch));
      bwd_convert_dq_kernel<Traits><<<convert_grid, Traits::kNThreads, 0, stream>>>(params, ws.dq_accum);
      if constexpr (kSplitsTail<Traits, kMask, kScoreMod>) {
        if (tail.is_split()) {
          bwd_convert_dkv_tail_kernel<Traits><<<unsigned(split_tasks), Traits::kNThreads, 0, stream>>>(params, tail);
        }
      }
      return cudaPeekAtLastError() == cudaSuccess ? Status::kSuccess : Status::kCudaError;
    }
  }
  // The main kernel without a dQ accumulator (that variant never touches
  // it), then the dQ kernel.
  auto* dkdv_kernel = dkdv_kernel_for<Traits, kMask, false, kScoreMod>(varlen, dropout);
  cudaError_t err = launch_with_smem<Traits::kSmemBytes>(dkdv_kernel, dkdv_grid, Traits::kNThreads, stream, params,
                                                         static_cast<float*>(nullptr), dsum, tail);
  if (err != cudaSuccess) return Status::kCudaError;
  const dim3 dq_grid(unsigned(ceil_div(params.seqlen_q, DqTraits::kBlockM) * params.nheads * params.batch));
  auto* dq_kernel = dq_kernel_for<DqTraits, kMask, kScoreMod>(dropout);
  err = launch_with_smem<DqTraits::kSmemDqBytes>(dq_kernel, dq_grid, DqTraits::kNThreads, stream, params, dsum);
  return err == cudaSuccess ? Status::kSuccess : Status::kCudaError;
}

// The main kernel's traits for each mask of one (head dim, dtype, budget):
// no mask uses BwdBudgetConfig<kHeadDim, false, kBudget>, causal and local
// BwdBudgetConfig<kHeadDim, true, kBudget>.
template <int kHeadDim, class Element, SmemBudget kBudget = SmemBudget::k227KB>
struct BwdTraitsFor {
  template <bool kIsCausal>
  using type = BwdTraits<kHeadDim, Element, BwdBudgetConfig<kHeadDim, kIsCausal, kBudget>>;
};
template <int kHeadDim, class Element, SmemBudget kBudget = SmemBudget::k227KB>
using BwdDqTraitsFor = BwdTraits<kHeadDim, Element, BwdDqBudgetConfig<kHeadDim, kBudget>>;

// The shared memory per block run_bwd<kHeadDim, Element, kScoreMod,
// kBudget>'s kernels use: the largest of its main kernels' and its dQ
// kernel's.
template <int kHeadDim, class Element, SmemBudget kBudget>
constexpr int bwd_smem_bytes() {
  using Main = BwdTraitsFor<kHeadDim, Element, kBudget>;
  return std::max({Main::template type<false>::kSmemBytes, Main::template type<true>::kSmemBytes,
                   BwdDqTraitsFor<kHeadDim, Element, kBudget>::kSmemDqBytes});
}

// The budget those kernels need.
template <int kHeadDim, class Element, SmemBudget kBudget>
constexpr SmemBudget bwd_smem_needed() {
  return smem_budget_holding(bwd_smem_bytes<kHeadDim, Element, kBudget>());
}

// run_bwd_with for the mask that params ask for, with MainTraits<kIsCausal>
// (as BwdTraitsFor) for the main kernel.
template <template <bool> class MainTraits, class DqTraits, bool kScoreMod>
Status run_bwd_for_mask(const BwdParams& params, cudaStream_t stream) {
  int window_left = params.window_left, window_right = params.window_right;
  switch (resolve_mask(params.causal, window_left, window_right)) {
    case MaskKind::kNone:
      return run_bwd_with<MainTraits<false>, DqTraits, MaskKind::kNone, kScoreMod>(params, stream);
    case MaskKind::kCausal:
      return run_bwd_with<MainTraits<true>, DqTraits, MaskKind::kCausal, kScoreMod>(params, stream);
    default:
      return run_bwd_with<MainTraits<true>, DqTraits, MaskKind::kLocal, kScoreMod>(params, stream);
  }
}

// Entry point a generated kernels/ file instantiates and registers. Assumes
// can_implement_bwd(params) passed. kScoreMod: the kernels that apply
// softcap, ALiBi and dropout (common/score_mod.hpp, common/dropout.hpp); the
// others refuse params that ask for any of them. kBudget: the tiles for that
// much shared memory per block (BwdBudgetConfig, BwdDqBudgetConfig).
template <int kHeadDim, class Element, bool kScoreMod = false, SmemBudget kBudget = SmemBudget::k227KB>
Status run_bwd(const BwdParams& params, cudaStream_t stream) {
  static_assert(bwd_smem_needed<kHeadDim, Element, kBudget>() <= kBudget, "BwdBudgetConfig exceeds its budget");
  return run_bwd_for_mask<BwdTraitsFor<kHeadDim, Element, kBudget>::template type,
                          BwdDqTraitsFor<kHeadDim, Element, kBudget>, kScoreMod>(params, stream);
}

}  // namespace flashtile::sm80
