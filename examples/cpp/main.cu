// flashtile from C++, header-only: this file instantiates the forward kernel
// it needs (head dim 128, bf16), runs it on random data, and checks out and
// lse against a naive fp32 reference kernel. Exit status 0 means it passed.
#include <flashtile/flashtile.hpp>
#include <flashtile/sm80/fwd_launch.hpp>

#include "attention_check.cuh"

int main() {
  bool ok = true;
  // 1. Direct launch of the instantiation this file compiles.
  auto direct = [](const flashtile::FwdParams& p) {
    const flashtile::Status can = flashtile::can_implement_fwd(p);
    return can != flashtile::Status::kSuccess ? can : flashtile::sm80::run_fwd<kHeadDim, Element>(p, 0);
  };
  ok &= check({2, 300, 517, 8, 2, false}, direct);
  ok &= check({2, 517, 300, 8, 8, true}, direct);

  // 2. Runtime dispatch: register the instantiation with the shared memory
  // its kernels need, then call flashtile::fwd, which looks the kernel up by
  // (head dim, dtype) and the GPU's shared memory per block.
  flashtile::KernelRegistry::instance().add_fwd(
      {flashtile::Direction::kFwd, flashtile::Arch::kSm80, kHeadDim, flashtile::DType::kBf16,
       flashtile::Variant::kPlain},
      &flashtile::sm80::run_fwd<kHeadDim, Element>,
      flashtile::sm80::fwd_smem_needed<kHeadDim, Element, flashtile::SmemBudget::k227KB>());
  auto dispatched = [](const flashtile::FwdParams& p) { return flashtile::fwd(p, 0); };
  ok &= check({1, 1024, 1024, 4, 1, true}, dispatched);

  // 3. Errors are return values: an unsupported head dim is refused before
  // anything is launched.
  flashtile::FwdParams bad;
  bad.q = bad.k = bad.v = bad.out = reinterpret_cast<void*>(256);
  bad.lse = reinterpret_cast<float*>(256);
  bad.batch = bad.nheads = bad.nheads_k = bad.seqlen_q = bad.seqlen_k = 1;
  bad.head_dim = 96;
  bad.softmax_scale = 0.1f;
  const flashtile::Status refused = flashtile::fwd(bad, 0);
  std::printf("head_dim 96: %s\n", flashtile::status_string(refused));
  ok &= refused == flashtile::Status::kUnsupportedHeadDim;

  std::printf("%s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
