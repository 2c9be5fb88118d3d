// Host launcher for the SM80 forward kernel of one (head dim, dtype, score
// modifiers or not). The mask kind (none, causal, local window) picks the
// instantiation; without a mask the plain kernel also switches tiles on
// seqlen_k (FwdShortConfig); everything else is runtime.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <type_traits>

#include "flashtile/common/attn_probs_kernel.hpp"
#include "flashtile/common/device.hpp"
#include "flashtile/params.hpp"
#include "flashtile/sm80/fwd_kernel.hpp"
#include "flashtile/sm80/fwd_traits.hpp"
#include "flashtile/smem_budget.hpp"
#include "flashtile/status.hpp"

namespace flashtile::sm80 {

template <class Traits, MaskKind kMask, bool kScoreMod = false>
Status launch_fwd(const FwdParams& params, cudaStream_t stream) {
  // Fixed-length and variable-length batches run separate instantiations
  // (common/seqlen.hpp says why).
  auto* kernel = is_varlen(params) ? &fwd_kernel<Traits, kMask, kScoreMod, true>
                                   : &fwd_kernel<Traits, kMask, kScoreMod, false>;
  constexpr int kSmemBytes = Traits::kSmemBytes;
  if constexpr (kSmemBytes > 99 * 1024) {
    // Head dim 256's 128 KB without a mask: more than sm86, sm89 and sm120
    // offer (their dispatch takes run_fwd's k99KB instantiation).
    const Status fits = check_smem_per_block(kSmemBytes);
    if (fits != Status::kSuccess) return fits;
  }
  if constexpr (kSmemBytes > 48 * 1024) {
    // Above 48 KB a kernel must opt in to the larger dynamic shared memory.
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) !=
        cudaSuccess) {
      return Status::kCudaError;
    }
  }
  const dim3 grid(ceil_div(params.seqlen_q, Traits::kBlockM), params.nheads, params.batch);
  kernel<<<grid, Traits::kNThreads, kSmemBytes, stream>>>(params);
  return cudaPeekAtLastError() == cudaSuccess ? Status::kSuccess : Status::kCudaError;  // cause left set
}

// The shared memory per block run_fwd<kHeadDim, Element, kScoreMod,
// kBudget>'s kernels use, either variant: the largest of its tiles'.
template <int kHeadDim, class Element, SmemBudget kBudget>
constexpr int fwd_smem_bytes() {
  int bytes = std::max({FwdTraitsFor<kHeadDim, false, Element, kBudget, false>::kSmemBytes,
                        FwdTraitsFor<kHeadDim, true, Element, kBudget, false>::kSmemBytes,
                        FwdTraitsFor<kHeadDim, false, Element, kBudget, true>::kSmemBytes,
                        FwdTraitsFor<kHeadDim, true, Element, kBudget, true>::kSmemBytes});
  if constexpr (kFwdShortTile<kHeadDim, kBudget>) {
    bytes = std::max(bytes, FwdShortTraitsFor<kHeadDim, Element>::kSmemBytes);
  }
  return bytes;
}

// Whether run_fwd's tiles for kBudget are the default ones (a budget's own
// launcher would then be a copy: generate.py's files check it is not).
template <int kHeadDim, class Element, SmemBudget kBudget>
constexpr bool fwd_tiles_are_default() {
  constexpr SmemBudget kDefault = SmemBudget::k227KB;
  return std::is_same_v<FwdTraitsFor<kHeadDim, false, Element, kBudget, false>,
                        FwdTraitsFor<kHeadDim, false, Element, kDefault, false>> &&
         std::is_same_v<FwdTraitsFor<kHeadDim, true, Element, kBudget, false>,
                        FwdTraitsFor<kHeadDim, true, Element, kDefault, false>> &&
         std::is_same_v<FwdTraitsFor<kHeadDim, false, Element, kBudget, true>,
                        FwdTraitsFor<kHeadDim, false, Element, kDefault, true>> &&
         std::is_same_v<FwdTraitsFor<kHeadDim, true, Element, kBudget, true>,
                        FwdTraitsFor<kHeadDim, true, Element, kDefault, true>> &&
         kFwdShortTile<kHeadDim, kBudget> == kFwdShortTile<kHeadDim, kDefault>;
}

// The budget those kernels need.
template <int kHeadDim, class Element, SmemBudget kBudget>
constexpr SmemBudget fwd_smem_needed() {
  return smem_budget_holding(fwd_smem_bytes<kHeadDim, Element, kBudget>());
}

// Entry point a generated kernels/ file instantiates and registers. Assumes
// can_implement_fwd(params) passed. kScoreMod: the kernels that apply
// softcap, ALiBi and dropout (params' choice, common/score_mod.hpp and
// common/dropout.hpp) and write the testing-only attn_probs; the others
// refuse params that ask for any of them. kBudget: the tiles for that much
// shared memory per block (FwdBudgetConfig).
template <int kHeadDim, class Element, bool kScoreMod = false, SmemBudget kBudget = SmemBudget::k227KB>
Status run_fwd(const FwdParams& params, cudaStream_t stream) {
  static_assert(fwd_smem_needed<kHeadDim, Element, kBudget>() <= kBudget, "FwdBudgetConfig exceeds its budget");
  if (!kScoreMod && uses_score_mod(params)) return Status::kInvalidArgument;
  FwdParams p = params;  // with causal folded into the window
  using FullTraits = FwdTraitsFor<kHeadDim, false, Element, kBudget, kScoreMod>;
  using MaskedTraits = FwdTraitsFor<kHeadDim, true, Element, kBudget, kScoreMod>;  // causal and windows
  Status status;
  switch (resolve_mask(p.causal, p.window_left, p.window_right)) {
    case MaskKind::kNone:
      if constexpr (!kScoreMod && kFwdShortTile<kHeadDim, kBudget>) {
        if (p.seqlen_k <= FwdShortConfig<kHeadDim>::kMaxSeqlenK) {
          status = launch_fwd<FwdShortTraitsFor<kHeadDim, Element>, MaskKind::kNone, kScoreMod>(p, stream);
          break;
        }
      }
      status = launch_fwd<FullTraits, MaskKind::kNone, kScoreMod>(p, stream);
      break;
    case MaskKind::kCausal:
      status = launch_fwd<MaskedTraits, MaskKind::kCausal, kScoreMod>(p, stream);
      break;
    default:  // windows: the causal tiles (short rows)
      status = launch_fwd<MaskedTraits, MaskKind::kLocal, kScoreMod>(p, stream);
      break;
  }
  if constexpr (kScoreMod) {
    // Testing only: the probabilities, from the forward's lse.
    if (status == Status::kSuccess && p.attn_probs != nullptr) status = launch_attn_probs<Element, 80>(p, stream);
  }
  return status;
}

}  // namespace flashtile::sm80
