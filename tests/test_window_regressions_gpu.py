"""Regressions of issue 21: sliding windows bounded on the left, with
seqlen_q > seqlen_k, gave errors of order 1 (forward and backward, dense and
varlen, head dims 96/128/256) because the window was rewritten the way
flash_attn 2.x's kernels do (a right side of -1 next to a bounded left one
became seqlen_k) instead of meaning what the docstring says. Here: window
shapes × seqlen_q <, =, > seqlen_k × dense and varlen × forward and
backward, at every head dim, on every kernel that serves them: the plain and
the softcap/ALiBi ("scoremod") variants, and for the backward both the sm90
(wgmma) and the sm80 (mma.sync) path where both are built. Each is checked
against the float64 reference with FlashAttention's rule (the fuzzer's
checks, tests/fuzz.py)."""

import dataclasses

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from flashtile import _C

import fuzz

BUILT = fuzz.built_combos()
ARCHS = fuzz.dispatch_archs()
# (head dim, dtype, variant) with an sm90 (wgmma) backward: there "sm80"
# (the dispatch limit) runs the other path; elsewhere both run the same kernels.
WGMMA_BWD = {(int(hd), str(dt), str(var)) for direction, arch, hd, dt, var in _C.built_kernels()
             if direction == "bwd" and arch == "sm90"}
# The windows, and their neighbours: one side bounded, both, zero-width.
WINDOWS = [(0, -1), (0, 33), (128, -1), (5, 2), (16, 16), (-1, 0), (0, 0), (40, 200)]
# seqlen_q above, equal to and below seqlen_k, and the 63 / 31.
SEQLENS = [(63, 31), (31, 63), (77, 77), (300, 45)]
BASE = fuzz.Case(seed=0, form="func", dtype="bf16", head_dim=128, nheads=4, nheads_k=2, seqlens_q=[63],
                 seqlens_k=[31], seqused_k=None, causal=False, window=(0, -1), window_as_tensor=False, softcap=0.0,
                 alibi=None, dropout_p=0.0, softmax_scale=None, layout="contiguous", deterministic=False, arch="sm90")


@pytest.fixture(autouse=True)
def _no_dispatch_limit():
    yield
    _C.limit_dispatch_arch("sm90")


def _variant_args(variant):
    return dict(softcap=20.0, alibi="heads") if variant == "scoremod" else {}


def _require(head_dim, dtype, variant, arch):
    if (head_dim, dtype, variant) not in BUILT:
        pytest.skip(f"hdim{head_dim}/{dtype}/{variant} is not in this build")
    if arch == "sm80" and (head_dim, dtype, variant) not in WGMMA_BWD:
        pytest.skip("no wgmma kernel here: the sm80 path is what runs without the limit")
    if arch not in ARCHS:
        pytest.skip(f"the dispatch limited to {arch} runs no forward on this GPU with this build "
                    "(FLASHTILE_SM80_ON_SM90=ON builds it)")


@pytest.mark.parametrize("arch", ["sm90", "sm80"])
@pytest.mark.parametrize("variant", ["plain", "scoremod"])
@pytest.mark.parametrize("head_dim", fuzz.KERNEL_HEAD_DIMS)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_dense_windows(dtype, head_dim, variant, arch):
    _require(head_dim, dtype, variant, arch)
    for i, (window, (sq, sk)) in enumerate((w, s) for w in WINDOWS for s in SEQLENS):
        case = dataclasses.replace(BASE, seed=1000 * head_dim + i, dtype=dtype, head_dim=head_dim,
                                   seqlens_q=[sq, sq], seqlens_k=[sk, sk], window=window, arch=arch,
                                   **_variant_args(variant))
        try:
            fuzz.run_case(case)
        except AssertionError as exc:
            raise AssertionError(f"window {window}, seqlen_q {sq}, seqlen_k {sk}: {exc}") from None


@pytest.mark.parametrize("arch", ["sm90", "sm80"])
@pytest.mark.parametrize("variant", ["plain", "scoremod"])
@pytest.mark.parametrize("head_dim", fuzz.KERNEL_HEAD_DIMS)
def test_varlen_windows(head_dim, variant, arch):
    """One batch holding each relation, the issue's 1000 queries on 1 key
    first, and an empty sequence; causal too."""
    _require(head_dim, "bf16", variant, arch)
    seqlens_q, seqlens_k = [1000, 63, 31, 77, 0, 5], [1, 31, 63, 77, 9, 0]
    for i, window in enumerate(WINDOWS):
        for causal in (False, True):
            case = dataclasses.replace(BASE, seed=2000 * head_dim + 2 * i + causal, form="varlen",
                                       head_dim=head_dim, seqlens_q=seqlens_q, seqlens_k=seqlens_k, window=window,
                                       causal=causal, arch=arch, **_variant_args(variant))
            try:
                fuzz.run_case(case)
            except AssertionError as exc:
                raise AssertionError(f"window {window}, causal {causal}: {exc}") from None
