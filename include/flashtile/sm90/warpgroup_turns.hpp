// Two consumer warpgroups taking turns at issuing their wgmma products
// ("ping-pong"): while one issues its products the other runs its softmax,
// so the tensor cores see one warpgroup's products at a time and each
// warpgroup's exponentials hide behind the other's products.
//
// Each warpgroup w waits on a named barrier of its own (256 threads: its 128
// waiting, the other's 128 arriving) and, once its products are issued,
// arrives on the other's. Warpgroup 1 arrives on warpgroup 0's once at the
// start, so warpgroup 0 goes first; from there the turns alternate strictly,
// and each barrier has at most one arrival outstanding. Both warpgroups take
// the same number of turns on a tile (they share its key blocks), so the
// last turn of warpgroup 1 passes to no one: every arrival is then waited
// for, and no barrier is left half-arrived at exit.
#pragma once

#include <cute/config.hpp>
#include <cutlass/arch/barrier.h>

namespace flashtile::sm90 {

template <int kWarpgroups>
struct ProductTurns {
  static_assert(kWarpgroups == 1 || kWarpgroups == 2, "turns between one or two consumer warpgroups");
  static constexpr bool kEnabled = kWarpgroups == 2;
  static constexpr uint32_t kThreads = 256;
  static constexpr uint32_t kFirstBarrier = 0;  // after CUTLASS's reserved ones (NamedBarrier adds them)

  int warpgroup;  // this consumer warpgroup, 0 or 1

  CUTE_DEVICE explicit ProductTurns(int warpgroup_) : warpgroup(warpgroup_) {
    if constexpr (kEnabled) {
      if (warpgroup == 1) cutlass::arch::NamedBarrier::arrive(kThreads, kFirstBarrier + 0);
    }
  }

  CUTE_DEVICE void wait() const {
    if constexpr (kEnabled) cutlass::arch::NamedBarrier::sync(kThreads, kFirstBarrier + warpgroup);
  }

  CUTE_DEVICE void pass() const {
    if constexpr (kEnabled) cutlass::arch::NamedBarrier::arrive(kThreads, kFirstBarrier + (1 - warpgroup));
  }

  // The tile's last turn: warpgroup 1's goes to no one (see above).
  CUTE_DEVICE void pass_last() const {
    if constexpr (kEnabled) {
      if (warpgroup == 0) pass();
    }
  }
};

}  // namespace flashtile::sm90
