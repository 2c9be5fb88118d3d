// flashtile's public C++ API: exact attention, FlashAttention-2 style.
//
// Header-only use: include this header, then instantiate the launchers you
// need in your own .cu file, e.g.
//   flashtile::sm80::run_fwd<128, cutlass::bfloat16_t>(params, stream);
// Runtime dispatch over the kernels a build registered: flashtile::fwd(),
// flashtile::bwd(), flashtile::kvcache() (kvcache.hpp).
// Every entry point returns a Status; none throws, aborts or prints.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "flashtile/common/device.hpp"
#include "flashtile/head_dims.hpp"
#include "flashtile/kvcache.hpp"
#include "flashtile/layout_checks.hpp"
#include "flashtile/params.hpp"
#include "flashtile/registry.hpp"
#include "flashtile/sm90/tma_support.hpp"
#include "flashtile/smem_budget.hpp"
#include "flashtile/status.hpp"
#include "flashtile/workspace.hpp"

namespace flashtile {

// Rows of q and of k each: the mask arithmetic (common/mask.hpp) adds a few
// seqlens and windows capped at seqlen_q + seqlen_k in int.
constexpr int kMaxSeqlen = 1 << 29;

// The backward kernels' grids are 1-D: blocks of rows × heads × batch,
// counted here with 64-row blocks (the smallest tile), within CUDA's
// gridDim.x limit.
constexpr int64_t kMaxGridBlocks = 2147483647;
inline int64_t grid_blocks(int64_t rows, int64_t heads, int64_t batch) {
  return (rows + 63) / 64 * heads * batch;
}

// softcap is 0 (off) or a positive finite number; ALiBi's slope strides are
// not negative (the slopes themselves may be any float).
template <class Params>
bool score_mod_valid(const Params& p) {
  if (!(p.softcap >= 0.f && p.softcap <= std::numeric_limits<float>::max())) return false;  // NaN fails too
  return p.alibi_slopes == nullptr || (p.alibi_slopes_batch_stride >= 0 && p.alibi_slopes_head_stride >= 0);
}

// dropout_p is in [0, 1) (NaN fails), with a seed when above 0.
template <class Params>
bool dropout_valid(const Params& p) {
  if (!(p.dropout_p >= 0.f && p.dropout_p < 1.f)) return false;
  return p.dropout_p == 0.f || p.dropout_seed != nullptr;
}

// The testing-only attn_probs covers every (row, key) of the longest
// sequences, and its grid (common/attn_probs_kernel.hpp) fits CUDA's limits:
// 16-row tiles in y, (batch, head) in z.
inline bool attn_probs_valid(const FwdParams& p) {
  if (p.attn_probs == nullptr) return true;
  return p.attn_probs_rows >= p.seqlen_q && p.attn_probs_cols >= p.seqlen_k &&
         p.attn_probs_rows <= 16 * 65535 && int64_t(p.batch) * p.nheads <= 65535;
}

// A variable-length batch names both cu_seqlens arrays and the packed row
// counts; seqused_k only comes with them. (The offsets' values are on the
// device and not read here: the kernels clamp them into the tensors.)
template <class Params>
bool varlen_valid(const Params& p) {
  if (!is_varlen(p)) return p.cu_seqlens_k == nullptr && p.seqused_k == nullptr;
  return p.cu_seqlens_k != nullptr && p.total_q >= 1 && p.total_k >= 1;
}

// The rows a batch's outputs span for the overlap check: batch × seqlen, or
// one packed sequence of total rows when varlen.
template <class Params>
bool outputs_distinct(const Params& p, bool query_side, int64_t batch_stride, int64_t row_stride,
                      int64_t head_stride) {
  const int64_t heads = query_side ? p.nheads : p.nheads_k;
  if (is_varlen(p)) {
    return non_overlapping(1, query_side ? p.total_q : p.total_k, heads, p.head_dim, 0, row_stride, head_stride);
  }
  return non_overlapping(p.batch, query_side ? p.seqlen_q : p.seqlen_k, heads, p.head_dim, batch_stride,
                         row_stride, head_stride);
}

// Checks everything the kernels assume about params, without touching the GPU.
inline Status can_implement_fwd(const FwdParams& p) {
  if (!p.q || !p.k || !p.v || !p.out || !p.lse) return Status::kInvalidArgument;
  if (p.batch < 1 || p.nheads < 1 || p.nheads_k < 1 || p.seqlen_q < 1 || p.seqlen_k < 1 ||
      p.seqlen_q > kMaxSeqlen || p.seqlen_k > kMaxSeqlen) {
    return Status::kInvalidArgument;
  }
  if (p.nheads % p.nheads_k != 0 || !varlen_valid(p)) return Status::kInvalidArgument;
  // Grid: (query blocks, nheads, batch); y and z are limited to 65535. (A
  // 1-D grid like the backward's measured 4–6 % slower at head dim 128.)
  if (p.nheads > 65535 || p.batch > 65535) return Status::kInvalidArgument;
  if (!is_supported_head_dim(p.head_dim)) return Status::kUnsupportedHeadDim;
  if (!(p.softmax_scale > 0.f)) return Status::kInvalidArgument;
  if (p.window_left < -1 || p.window_right < -1) return Status::kInvalidArgument;
  if (!score_mod_valid(p) || !dropout_valid(p) || !attn_probs_valid(p)) return Status::kInvalidArgument;
  if (!strides_non_negative({p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.k_batch_stride, p.k_row_stride,
                             p.k_head_stride, p.v_batch_stride, p.v_row_stride, p.v_head_stride,
                             p.out_batch_stride, p.out_row_stride, p.out_head_stride}) ||
      !outputs_distinct(p, true, p.out_batch_stride, p.out_row_stride, p.out_head_stride)) {
    return Status::kInvalidArgument;
  }
  // cp.async and the epilogue move 16-byte vectors: 8 two-byte elements.
  const bool aligned =
      vector_aligned(p.q, {p.q_batch_stride, p.q_row_stride, p.q_head_stride}) &&
      vector_aligned(p.k, {p.k_batch_stride, p.k_row_stride, p.k_head_stride}) &&
      vector_aligned(p.v, {p.v_batch_stride, p.v_row_stride, p.v_head_stride}) &&
      vector_aligned(p.out, {p.out_batch_stride, p.out_row_stride, p.out_head_stride});
  if (!aligned) return Status::kMisalignedPointer;
  return Status::kSuccess;
}

// Checks everything the backward kernels assume about params.
inline Status can_implement_bwd(const BwdParams& p) {
  if (!p.q || !p.k || !p.v || !p.out || !p.dout || !p.lse || !p.dq || !p.dk || !p.dv ||
      !p.workspace) {
    return Status::kInvalidArgument;
  }
  if (p.batch < 1 || p.nheads < 1 || p.nheads_k < 1 || p.seqlen_q < 1 || p.seqlen_k < 1 ||
      p.seqlen_q > kMaxSeqlen || p.seqlen_k > kMaxSeqlen) {
    return Status::kInvalidArgument;
  }
  if (p.nheads % p.nheads_k != 0 || !varlen_valid(p)) return Status::kInvalidArgument;
  // Grids: every backward kernel's is 1-D within 2^31 − 1 blocks (counted
  // with 64-row blocks, the smallest tile): key blocks × K/V heads × batch
  // (main kernel), query blocks × query heads × batch (dQ, convert).
  if (grid_blocks(p.seqlen_k, p.nheads_k, p.batch) > kMaxGridBlocks ||
      grid_blocks(p.seqlen_q, p.nheads, p.batch) > kMaxGridBlocks) {
    return Status::kInvalidArgument;
  }
  if (!is_supported_head_dim(p.head_dim)) return Status::kUnsupportedHeadDim;
  if (!(p.softmax_scale > 0.f)) return Status::kInvalidArgument;
  if (p.window_left < -1 || p.window_right < -1) return Status::kInvalidArgument;
  if (!score_mod_valid(p) || !dropout_valid(p)) return Status::kInvalidArgument;
  if (!strides_non_negative({p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.k_batch_stride, p.k_row_stride,
                             p.k_head_stride, p.v_batch_stride, p.v_row_stride, p.v_head_stride,
                             p.out_batch_stride, p.out_row_stride, p.out_head_stride, p.dout_batch_stride,
                             p.dout_row_stride, p.dout_head_stride, p.dq_batch_stride, p.dq_row_stride,
                             p.dq_head_stride, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride,
                             p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride}) ||
      !outputs_distinct(p, true, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride) ||
      !outputs_distinct(p, false, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride) ||
      !outputs_distinct(p, false, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride)) {
    return Status::kInvalidArgument;
  }
  const bool aligned =
      vector_aligned(p.q, {p.q_batch_stride, p.q_row_stride, p.q_head_stride}) &&
      vector_aligned(p.k, {p.k_batch_stride, p.k_row_stride, p.k_head_stride}) &&
      vector_aligned(p.v, {p.v_batch_stride, p.v_row_stride, p.v_head_stride}) &&
      vector_aligned(p.out, {p.out_batch_stride, p.out_row_stride, p.out_head_stride}) &&
      vector_aligned(p.dout, {p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride}) &&
      vector_aligned(p.dq, {p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride}) &&
      vector_aligned(p.dk, {p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride}) &&
      vector_aligned(p.dv, {p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride}) &&
      vector_aligned(p.workspace, {});
  return aligned ? Status::kSuccess : Status::kMisalignedPointer;
}

// The kernels that serve params: those with modifiers when softcap, ALiBi,
// dropout or (forward) attn_probs is asked for, else the plain ones.
template <class Params>
Variant variant_for(const Params& p) {
  return uses_score_mod(p) ? Variant::kScoreMod : Variant::kPlain;
}

// The shared memory per block the dispatch plans for: the current GPU's
// (smem_budget.hpp), or less under the registry's test limit.
inline SmemBudget dispatch_smem_budget(const KernelRegistry& registry) {
  return std::min(device_smem_budget(), registry.smem_limit());
}

// The wgmma kernels are for the H100/H200 and need its 227 KB: they run where
// the registry's limits allow them (registry.hpp) and the device is sm90.
inline bool sm90_dispatch_allowed(const KernelRegistry& registry) {
  return registry.arch_allowed(Arch::kSm90) && registry.smem_limit() == SmemBudget::k227KB &&
         device_is_sm90();
}

// No launcher within the GPU's budget: kUnsupportedDevice when the build has
// one for a larger budget (FLASHTILE_SMEM_BUDGETS left this GPU's out), else
// kNotBuilt.
inline Status not_found(bool built_for_larger_budget) {
  return built_for_larger_budget ? Status::kUnsupportedDevice : Status::kNotBuilt;
}

// Whether this device runs only launchers with code for it: on a 9.0 device
// in a build with code for 9.0 (find_sm80).
inline bool sm90_code_required(const KernelRegistry& registry) {
  return device_is_sm90() && registry.has_sm90_code();
}

// The sm80 path's launcher for params, with the tiles for the GPU's shared
// memory (the largest built budget within dispatch_smem_budget). A build
// with sm90a compiles for its other archs only the sm80 kernels that an
// H100/H200 does not run (CMakeLists.txt): the forward's, and the plain
// backward's, whose params (strides TMA cannot step, dropout, or the
// dispatch limited to sm80) run on a 9.0 device the score-modifier
// backward, which takes plain attention too. The forward's such params
// (q, k or v with a row stride of 0, the dispatch limited to sm80 or to a
// smaller budget, whose tiles such a build compiles for sm80 alone) get
// nullptr there: the caller copies those tensors first (python/flashtile's
// _ops.py) or builds with FLASHTILE_SM80_ON_SM90. Only a build with no code
// for 9.0 at all (one without 90a) runs sm80 kernels on a 9.0 device, on
// the driver's JIT compilation of their compute_80 PTX.
template <class Find>
auto find_sm80(const KernelRegistry& registry, Variant variant, Find find) {
  const bool on_sm90 = device_is_sm90();
  const SmemBudget budget = dispatch_smem_budget(registry);
  auto launch = find(variant, budget, on_sm90);
  if (!launch && on_sm90 && variant == Variant::kPlain) launch = find(Variant::kScoreMod, budget, true);
  if (!launch && on_sm90 && !sm90_code_required(registry)) launch = find(variant, budget, false);
  return launch;
}

// Runs the backward registered for (head_dim, dtype, variant): on an sm90
// device the wgmma path's where one is built, sm90_dispatch_allowed and its
// kernels take params (sm90/tma_support.hpp's bwd_supports), else the sm80
// path's (find_sm80). Needs params.workspace of bwd_workspace_bytes(params)
// bytes.
inline Status bwd(const BwdParams& p, cudaStream_t stream) {
  const Status ok = can_implement_bwd(p);
  if (ok != Status::kSuccess) return ok;
  const KernelRegistry& registry = KernelRegistry::instance();
  BwdLauncher launch = nullptr;
  if (sm90_dispatch_allowed(registry) && sm90::bwd_supports(p)) {
    launch = registry.find_bwd(Arch::kSm90, p.head_dim, p.dtype, variant_for(p));
  }
  auto find = [&](Variant variant, SmemBudget budget, bool sm90_code_only) {
    return registry.find_bwd(Arch::kSm80, p.head_dim, p.dtype, variant, budget, sm90_code_only);
  };
  if (!launch) launch = find_sm80(registry, variant_for(p), find);
  if (!launch) return not_found(find(variant_for(p), SmemBudget::k227KB, sm90_code_required(registry)) != nullptr);
  return launch(p, stream);
}

// K and V expanded over their heads (both with head stride 0, as torch's
// expand makes them) hold one head's keys and values for every query head:
// the same forward as one KV head, which reads them once for all query
// heads. (The backward keeps the heads: dk and dv have one per KV head.)
inline FwdParams with_broadcast_kv_as_one_head(FwdParams p) {
  if (p.nheads_k > 1 && p.k_head_stride == 0 && p.v_head_stride == 0) p.nheads_k = 1;
  return p;
}

// Runs the forward registered for (head_dim, dtype, variant): on an sm90
// device the wgmma/TMA path's where one is built, sm90_dispatch_allowed and
// its kernels take params (sm90/tma_support.hpp: strides TMA can step),
// else the sm80 path's (find_sm80).
inline Status fwd(const FwdParams& params, cudaStream_t stream) {
  const Status ok = can_implement_fwd(params);
  if (ok != Status::kSuccess) return ok;
  const FwdParams p = with_broadcast_kv_as_one_head(params);
  const KernelRegistry& registry = KernelRegistry::instance();
  FwdLauncher launch = nullptr;
  if (sm90_dispatch_allowed(registry) && sm90::fwd_supports(p)) {
    launch = registry.find_fwd(Arch::kSm90, p.head_dim, p.dtype, variant_for(p));
  }
  auto find = [&](Variant variant, SmemBudget budget, bool sm90_code_only) {
    return registry.find_fwd(Arch::kSm80, p.head_dim, p.dtype, variant, budget, sm90_code_only);
  };
  if (!launch) launch = find_sm80(registry, variant_for(p), find);
  if (!launch) return not_found(find(variant_for(p), SmemBudget::k227KB, sm90_code_required(registry)) != nullptr);
  return launch(p, stream);
}

}  // namespace flashtile
