// The backward main kernel's walk (sm80/bwd_kernel.hpp and
// sm90/bwd_ws_kernel.hpp): the (query head, query block) pairs that see one CTA's key block, as one
// sequence of iterations, so a block's loads can be issued during the
// previous one. First every head's blocks that need the mask (a prefix of
// each head's blocks, BlockMask::m_block_mask_end; with a window's left edge
// also a suffix, local only), then the rest. The mma.sync main kernel
// runs each part in a loop of its own, so the mask-free one carries
// no mask code: with an `if` in one loop ptxas predicates the mask into ~300
// instructions issued on every block (19 % of the loop's instructions at
// d64, counted in the SASS). The warp-specialized kernel keeps one loop with
// the mask behind a uniform branch: its two loop copies were register-
// allocated apart and the unmasked one spilled (benchmarks/NOTES.md).
// With kAscending (the warp-specialized kernel's deterministic mode,
// sm90/dq_turns.hpp) the walk takes the query blocks in ascending order,
// every head of the group at each, and masked(it, m_block) says which need
// the mask: the higher a key block, the further on its first query block,
// so it reaches every (head, query block) earlier than the key block below.
#pragma once

#include <cute/tensor.hpp>

#include "flashtile/common/mask.hpp"

namespace flashtile {

using namespace cute;

template <MaskKind kMask, int kBlockM, int kBlockN, bool kAscending = false>
struct BwdQueryWalk {
  int first_head;               // the K/V head's first query head (GQA group)
  int group;                    // query heads per K/V head
  int m_block_begin;            // the first query block that sees the keys
  int m_block_mask_end;         // one past the masked prefix
  int m_block_left_mask_begin;  // the masked suffix (local; else the end)
  int prefix_per_head;
  int masked_per_head;
  int unmasked_per_head;
  int masked_iterations;        // iterations [0, masked_iterations) need the mask
  int iterations;

  CUTE_HOST_DEVICE BwdQueryWalk(BlockMask<kMask, kBlockM, kBlockN> const& mask, int n_block, int head_k,
                                int group_)
      : group(group_) {
    first_head = head_k * group;
    m_block_begin = mask.m_block_begin(n_block);
    const int m_block_end = max(m_block_begin, mask.m_block_end(n_block));
    m_block_mask_end = mask.m_block_mask_end(n_block, m_block_begin, m_block_end);
    m_block_left_mask_begin = mask.m_block_left_mask_begin(n_block, m_block_mask_end, m_block_end);
    prefix_per_head = m_block_mask_end - m_block_begin;
    masked_per_head = prefix_per_head + (m_block_end - m_block_left_mask_begin);
    unmasked_per_head = m_block_left_mask_begin - m_block_mask_end;
    masked_iterations = group * masked_per_head;
    iterations = group * (masked_per_head + unmasked_per_head);
  }

  // Iteration it -> (query head, query block).
  CUTE_HOST_DEVICE auto operator()(int it) const {
    if constexpr (kAscending) {
      return make_tuple(first_head + it % group, m_block_begin + it / group);
    }
    if (it < masked_iterations) {
      const int k = it % masked_per_head;
      int m_block = m_block_begin + k;
      if constexpr (kMask == MaskKind::kLocal) {
        if (k >= prefix_per_head) m_block = m_block_left_mask_begin + (k - prefix_per_head);
      }
      return make_tuple(first_head + it / masked_per_head, m_block);
    }
    const int j = it - masked_iterations;
    return make_tuple(first_head + j / unmasked_per_head, m_block_mask_end + j % unmasked_per_head);
  }

  // Whether iteration it, on query block m_block (operator()(it)'s), needs
  // the mask.
  CUTE_HOST_DEVICE bool masked(int it, int m_block) const {
    if constexpr (kAscending) {
      return m_block < m_block_mask_end || m_block >= m_block_left_mask_begin;
    } else {
      return it < masked_iterations;
    }
  }
};

}  // namespace flashtile
