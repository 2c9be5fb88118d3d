"""The tiles for GPUs with 99 KB (sm86, sm89, sm120) and 163 KB (A100) of
shared memory per block (include/flashtile/smem_budget.hpp), run on this GPU
through the dispatch limit (_C.limit_smem_budget): every head dim the build
has them for, forward and backward, atomic and deterministic dQ, with and
without dropout, against the reference; the profiler shows that the
budget's kernels ran. (FLASHTILE_TEST_SMEM_BUDGET runs the whole suite on
them, tests/README.md.)"""

import contextlib
import re

import pytest
import torch

import flashtile
from flashtile import _C
from kernel_names import budget_tiles_run_here, cuda_kernel_names, forced_smem_budget, fwd_tile_of
from reference import assert_close_fa_rule, attention_ref
import test_dropout_gpu
from test_backward_gpu import DTYPES, check_grads, flash_grads, rand_qkv, require_built
from test_forward_gpu import check_against_reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# (direction, head_dim, dtype name, kb) of each launcher tuned for a budget
# below the default 227 KB, plain variant.
BUDGET_LAUNCHERS = sorted({(d, hd, dn, tuned) for d, hd, dn, variant, needs, tuned, _ in _C.built_smem_budgets()
                           if variant == "plain" and tuned < 227})
BWD_CASES = [(hd, dn, kb) for d, hd, dn, kb in BUDGET_LAUNCHERS if d == "bwd"]
FWD_CASES = [(hd, dn, kb) for d, hd, dn, kb in BUDGET_LAUNCHERS if d == "fwd"]
# The budgets' tiles of the forward (FwdBudgetConfig): (kBlockM, kBlockN).
FWD_TILES = {(32, 99): (128, 64), (64, 99): (128, 64), (96, 99): (128, 32), (128, 99): (128, 32), (256, 99): (64, 32)}
# ... and of its variant with softcap, ALiBi or dropout.
FWD_TILES_SCOREMOD = {(32, 99): (128, 64), (64, 99): (128, 64), (96, 99): (128, 64), (128, 99): (128, 32),
                      (256, 99): (64, 16)}
BUDGET_INDEX = {99: 0, 163: 1, 227: 2}  # SmemBudget's values


@contextlib.contextmanager
def smem_budget(kb):
    if torch.cuda.get_device_properties(0).shared_memory_per_block_optin < kb * 1024:
        pytest.skip(f"this GPU offers less than {kb} KB of shared memory per block")
    if not budget_tiles_run_here(kb):
        pytest.skip(f"this build compiles the {kb} KB tiles for other GPUs than this H100/H200 only "
                    "(tests/README.md: FLASHTILE_CUDA_ARCHS=90a with FLASHTILE_SMEM_BUDGETS builds them for it)")
    _C.limit_smem_budget(kb)
    try:
        yield
    finally:
        _C.limit_smem_budget(forced_smem_budget() or 227)


def bwd_budgets_of(names):
    """The SmemBudget values in the names of the sm80 backward kernels among
    `names` (their BwdBudgetConfig / BwdDqBudgetConfig argument)."""
    found = set()
    for name in names:
        if "bwd_dkdv_kernel" in name or "bwd_dq_kernel" in name:
            match = re.search(r"SmemBudget\)(\d)", name) or re.search(r"SmemBudgetE(\d)E", name)
            assert match, name
            found.add(int(match[1]))
    return found


def require_case(head_dim, dtype_name):
    require_built(head_dim, DTYPES[dtype_name])


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim, dtype_name, kb", BWD_CASES)
def test_backward_on_budget_tiles(head_dim, dtype_name, kb, causal, deterministic):
    require_case(head_dim, dtype_name)
    q, k, v = rand_qkv(2, 257, 300, 4, 2, head_dim, DTYPES[dtype_name])
    with smem_budget(kb):
        out = flashtile.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
        dout = torch.randn_like(out)
        grads, names = cuda_kernel_names(lambda: flash_grads(out, (q, k, v), dout))
    assert bwd_budgets_of(names) == {BUDGET_INDEX[kb]}, names
    check_grads(q, k, v, dout, out, grads, causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim, dtype_name, kb", FWD_CASES)
def test_forward_on_budget_tiles(head_dim, dtype_name, kb, causal):
    require_case(head_dim, dtype_name)
    q, k, v = rand_qkv(2, 300, 257, 4, 2, head_dim, DTYPES[dtype_name], requires_grad=False)
    with smem_budget(kb):
        (out, lse, _), names = cuda_kernel_names(
            lambda: flashtile.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True))
    assert fwd_tile_of(names) == FWD_TILES[(head_dim, kb)]
    check_against_reference(q, k, v, out, lse, causal)


@pytest.mark.parametrize("head_dim, dtype_name, kb", FWD_CASES)
def test_forward_softcap_alibi_on_budget_tiles(head_dim, dtype_name, kb):
    require_case(head_dim, dtype_name)
    q, k, v = rand_qkv(2, 300, 257, 4, 2, head_dim, DTYPES[dtype_name], requires_grad=False)
    slopes = torch.rand(2, 4, device="cuda", dtype=torch.float32) * 0.3
    with smem_budget(kb):
        (out, lse, _), names = cuda_kernel_names(lambda: flashtile.flash_attn_func(
            q, k, v, causal=True, softcap=5.0, alibi_slopes=slopes, return_attn_probs=True))
    assert fwd_tile_of(names) == FWD_TILES_SCOREMOD[(head_dim, kb)]
    ref_out, ref_lse = attention_ref(q, k, v, causal=True, softcap=5.0, alibi_slopes=slopes)
    pt_out, pt_lse = attention_ref(q, k, v, causal=True, softcap=5.0, alibi_slopes=slopes, upcast=False)
    assert_close_fa_rule(out, ref_out, pt_out, "out")
    assert_close_fa_rule(lse, ref_lse, pt_lse, "lse")


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("head_dim, dtype_name, kb", BWD_CASES)
def test_dropout_on_budget_tiles(head_dim, dtype_name, kb, deterministic):
    """Dropout's mask on the budgets' tiles, whose threads hold two
    accumulator atoms where the default tiles hold four or more
    (Dropout::keep_bits' groups of two): the kernels' mask is the documented
    one, and out and the gradients match the reference with it."""
    require_case(head_dim, dtype_name)
    q, k, v = rand_qkv(1, 97, 150, 2, 2, head_dim, DTYPES[dtype_name])
    with smem_budget(kb):
        test_dropout_gpu.run_and_check(q, k, v, 0.3, causal=True, deterministic=deterministic)
