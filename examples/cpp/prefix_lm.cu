// A score modifier of one's own on the Hopper forward: a prefix-LM mask
// (every query sees the first prefix_len keys, and past them the keys up
// to its own position) passed to sm90::run_fwd_with, checked against the
// reference. Exit status 0: passed; 77: no H100/H200 (compute capability
// 9.0), nothing ran.
#include <flashtile/flashtile.hpp>
#include <flashtile/sm90/fwd_launch.hpp>

#include "attention_check.cuh"

// The modifier: the members flashtile/common/score_mod.hpp lists.
struct PrefixLM {
  struct Arguments {
    int prefix_len;
  };
  float softmax_scale;
  int prefix_len;
  int offset;  // seqlen_k − seqlen_q: query row i's diagonal is key i + offset

  template <class Params, class Seq>
  __device__ static PrefixLM make(Arguments const& args, Params const& params, Seq const& seq, int /*head*/) {
    return {params.softmax_scale, args.prefix_len, seq.seqlen_k - seq.seqlen_q};
  }
  __device__ float score_scale() const { return softmax_scale; }  // scores stay q·kᵀ
  template <class Acc, class Coords>
  __device__ void apply(Acc& acc_s, Coords const& coords, int row0, int col0) const {
    // Unrolled: the fragment lives in registers only if every index is a constant.
    CUTE_UNROLL
    for (int i = 0; i < cute::size(acc_s); ++i) {
      const int row = row0 + cute::get<0>(coords(i));
      const int col = col0 + cute::get<1>(coords(i));
      if (col >= prefix_len && col > row + offset) acc_s(i) = -INFINITY;
    }
  }
};

int main() {
  int devices = 0, device = 0, major = 0, minor = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device; skipped\n");
    return 77;
  }
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major != 9 || minor != 0) {
    std::printf("compute capability %d.%d: the sm90 forward needs 9.0; skipped\n", major, minor);
    return 77;
  }
  bool ok = true;
  for (const Problem pb : {Problem{2, 700, 700, 8, 2, true, 300}, Problem{1, 257, 1000, 4, 4, true, 129},
                           Problem{3, 333, 333, 4, 1, true, 0}}) {
    ok &= check(pb, [&](flashtile::FwdParams p) {
      p.causal = false;  // the modifier masks
      const flashtile::Status can = flashtile::can_implement_fwd(p);
      if (can != flashtile::Status::kSuccess) return can;
      return flashtile::sm90::run_fwd_with<kHeadDim, Element, PrefixLM>(p, {pb.prefix_len}, 0);
    });
  }
  std::printf("%s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
