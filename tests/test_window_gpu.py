"""Sliding-window (local) attention, forward and backward, against the
float32 reference with FlashAttention's error rule: windows with and without
causal, each side bounded or not, seqlen_q above, equal to and below
seqlen_k, rows whose window holds no key, every kernel head dim, fp16 and
bf16, GQA, the deterministic backward, and the window meaning what
flash_attn's docstring says for every seqlen_q and seqlen_k (the
regressions of issue 21: windows bounded on the left with seqlen_q >
seqlen_k, on every path, are in test_window_regressions_gpu.py)."""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import flashtile
from flashtile import _C, _checks
from reference import assert_close_fa_rule, attention_ref, attention_ref_backward

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
BUILT = {(int(d), str(n)) for direction, _arch, d, n, variant in _C.built_kernels()
         if direction == "bwd" and variant == "plain"}
# Windows leave rows with a single visible key (window (0, 0), a window's
# edge at the first or last key): there P = 1 and dP = D, so PyTorch's own
# low-precision dq cancels to exactly 0 and the rule leaves only this slack,
# while the kernel keeps the fp32 rounding of two dot products (~1e-6..1e-5);
# as GRAD_ATOL_ONE_KEY in test_backward_gpu.py.
GRAD_ATOL = 1e-4


def require_built(head_dim, dtype_name):
    if (head_dim, dtype_name) not in BUILT:
        pytest.skip(f"hdim{head_dim}/{dtype_name} is not in this build")


def rand_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype):
    shapes = ((batch, seqlen_q, nheads, head_dim), (batch, seqlen_k, nheads_k, head_dim),
              (batch, seqlen_k, nheads_k, head_dim))
    return tuple(torch.randn(s, device="cuda", dtype=dtype, requires_grad=True) for s in shapes)


def check_window(q, k, v, window_size, causal, deterministic=False):
    """out, lse, dq, dk, dv of flashtile against the reference under the
    window asked for (row i sees i + off - left .. i + off + right)."""
    out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=causal, window_size=window_size,
                                            deterministic=deterministic, return_attn_probs=True)
    ref_out, ref_lse = attention_ref(q.detach(), k.detach(), v.detach(), causal=causal,
                                     window_size=window_size)
    pt_out, pt_lse = attention_ref(q.detach(), k.detach(), v.detach(), causal=causal,
                                   window_size=window_size, upcast=False)
    assert_close_fa_rule(out, ref_out, pt_out, "out")
    assert_close_fa_rule(lse, ref_lse, pt_lse, "lse")
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    _, ref_grads = attention_ref_backward(q, k, v, dout, causal, window_size=window_size)
    _, pt_grads = attention_ref_backward(q, k, v, dout, causal, window_size=window_size, upcast=False)
    for name, got, ref, pt in zip(("dq", "dk", "dv"), grads, ref_grads, pt_grads):
        assert torch.isfinite(got).all(), f"{name} is not finite"
        assert_close_fa_rule(got, ref, pt, name, atol=GRAD_ATOL)
    return out, lse, grads


WINDOWS = [(0, 0), (3, 5), (16, 0), (100, 64), (250, -1), (-1, 37), (0, -1), (129, 129)]
SEQLENS = [(257, 257), (130, 700), (700, 130), (1, 300), (300, 1)]


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q, seqlen_k", SEQLENS)
@pytest.mark.parametrize("window_size", WINDOWS, ids=str)
def test_window_seqlens(window_size, seqlen_q, seqlen_k, causal, deterministic):
    q, k, v = rand_qkv(2, seqlen_q, seqlen_k, 4, 2, 128, torch.bfloat16)
    require_built(128, "bf16")
    check_window(q, k, v, window_size, causal, deterministic)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", list(_checks.SUPPORTED_HEAD_DIMS))
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_window_every_head_dim_and_dtype(dtype_name, head_dim, causal):
    require_built(head_dim, dtype_name)
    q, k, v = rand_qkv(2, 333, 517, 8, 2, head_dim, DTYPES[dtype_name])
    check_window(q, k, v, (90, 40), causal)


def test_rows_whose_window_is_empty():
    """seqlen_q > seqlen_k with a window of (0, 0): row i sees key
    i + seqlen_k - seqlen_q only, so the first seqlen_q - seqlen_k rows see
    nothing: out 0, lse -inf, zero dq there, every gradient finite."""
    require_built(128, "bf16")
    q, k, v = rand_qkv(2, 400, 150, 4, 4, 128, torch.bfloat16)
    out, lse, (dq, _, _) = check_window(q, k, v, (0, 0), causal=False)
    assert (out[:, :250] == 0).all() and torch.isneginf(lse[:, :, :250]).all()
    assert (dq[:, :250] == 0).all()


def test_windows_reaching_past_the_sequence_are_unbounded():
    """A side that reaches every key from every row is the unbounded side,
    bit for bit: (seqlen_k - 1, seqlen_q - 1) is global attention on the
    mask-free kernel, (seqlen_k - 1, 0) and causal with any right side are
    causal; and (0, -1) with seqlen_q 700 > seqlen_k 130 hides only keys left
    of each row's diagonal (row i sees keys max(0, i - 570) .. 129), where
    flash_attn 2.x's kernels also hide the keys right of i - 440, every key
    of rows 0 .. 439."""
    require_built(128, "bf16")
    q, k, v = rand_qkv(1, 200, 150, 2, 2, 128, torch.bfloat16)
    global_out = flashtile.flash_attn_func(q, k, v)
    assert torch.equal(flashtile.flash_attn_func(q, k, v, window_size=(149, 199)), global_out)
    causal_out = flashtile.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(flashtile.flash_attn_func(q, k, v, window_size=(149, 0)), causal_out)
    assert torch.equal(flashtile.flash_attn_func(q, k, v, causal=True, window_size=(-1, 9)), causal_out)
    q, k, v = rand_qkv(1, 700, 130, 2, 2, 128, torch.bfloat16)
    out, lse, _ = check_window(q, k, v, (0, -1), causal=False)
    assert torch.isfinite(lse).all()


def test_window_through_packed_functions_and_repeatable():
    require_built(128, "bf16")
    qkv = torch.randn(2, 300, 3, 4, 128, device="cuda", dtype=torch.bfloat16)
    a = flashtile.flash_attn_qkvpacked_func(qkv, window_size=(33, 12))
    b = flashtile.flash_attn_func(*qkv.unbind(2), window_size=(33, 12))
    assert torch.equal(a, b), "the forward is bitwise repeatable and packing does not change it"
    kv = qkv[:, :, 1:]
    c = flashtile.flash_attn_kvpacked_func(qkv[:, :, 0], kv, window_size=(33, 12))
    assert torch.equal(a, c)


def test_windows_near_int_max_through_the_op():
    """The op takes windows as given (no flash_attn normalization): a side
    near INT_MAX is unbounded, not an int overflow that empties the rows."""
    require_built(128, "bf16")
    q, k, v = rand_qkv(1, 256, 128, 2, 2, 128, torch.bfloat16)
    q, k, v = q.detach(), k.detach(), v.detach()
    big = 2**31 - 1
    for window in ((0, big), (big, 0), (big - 1, 3)):
        out, lse, _ = torch.ops.flashtile.fwd(q, k, v, 128 ** -0.5, False, False, *window)
        exact = tuple(-1 if w == big or w == big - 1 else w for w in window)
        ref_out, ref_lse = attention_ref(q, k, v, window_size=exact)
        pt_out, pt_lse = attention_ref(q, k, v, window_size=exact, upcast=False)
        assert_close_fa_rule(out, ref_out, pt_out, f"out {window}")
        assert_close_fa_rule(lse, ref_lse, pt_lse, f"lse {window}")
