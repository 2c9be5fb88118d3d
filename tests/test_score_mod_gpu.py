"""softcap and ALiBi, forward and backward, against the float32 reference
with FlashAttention's error rule: each alone and both together, with no
mask, causal and a sliding window, seqlen_q above, equal to and below
seqlen_k, every kernel head dim, fp16 and bf16, GQA, (nheads,) and
(batch, nheads) slopes in any layout, the deterministic backward, and the
packed functions. On an H100/H200 the cases run twice: on the dispatch's
choice (the wgmma forward's scoremod variant; the warp-specialized
backward's at every head dim) and on the sm80 kernels that other
GPUs run."""

import contextlib

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import flashtile
from flashtile import _C, _checks
from kernel_names import cuda_kernel_names, require_sm90, sm80_kernels_only, sm90_built
from reference import assert_close_fa_rule, attention_ref, attention_ref_backward

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# The sm80 (mma.sync) scoremod kernels: every dispatch below has them (the
# sm90 ones take part of it on an H100/H200).
BUILT = {(int(d), str(n)) for direction, arch, d, n, variant in _C.built_kernels()
         if direction == "bwd" and arch == "sm80" and variant == "scoremod"}
# As test_window_gpu.py: rows with a single visible key leave PyTorch's own
# low-precision dq at exactly 0, and the kernel's fp32 rounding needs this slack.
GRAD_ATOL = 1e-4


def require_built(head_dim, dtype_name):
    if (head_dim, dtype_name) not in BUILT:
        pytest.skip(f"the scoremod kernels for hdim{head_dim}/{dtype_name} are not in this build")


# "default": the kernels the dispatch picks on this GPU; "sm80": the mma.sync
# kernels alone (on an sm90 GPU, the forward other GPUs run).
DISPATCHES = ["default", "sm80"]


def dispatch_limit(dispatch):
    if dispatch == "default":
        return contextlib.nullcontext()
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the default dispatch of this GPU runs the sm80 kernels already")
    return sm80_kernels_only()


def rand_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, scale=1.0):
    shapes = ((batch, seqlen_q, nheads, head_dim), (batch, seqlen_k, nheads_k, head_dim),
              (batch, seqlen_k, nheads_k, head_dim))
    return tuple((torch.randn(s, device="cuda", dtype=dtype) * scale).requires_grad_() for s in shapes)


def alibi_slopes_for(batch, nheads, per_batch):
    """ALiBi's geometric slopes 2^(-8 (h + 1) / nheads), times a random factor
    per batch row when per_batch."""
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / nheads) for h in range(nheads)], device="cuda")
    if per_batch:
        return slopes * torch.rand(batch, 1, device="cuda").add_(0.5)
    return slopes


def check(q, k, v, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False):
    """out, lse, dq, dk, dv of flashtile against the reference."""
    out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=causal, window_size=window_size, softcap=softcap,
                                            alibi_slopes=alibi_slopes, deterministic=deterministic,
                                            return_attn_probs=True)
    opts = dict(causal=causal, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes)
    ref_out, ref_lse = attention_ref(q.detach(), k.detach(), v.detach(), **opts)
    pt_out, pt_lse = attention_ref(q.detach(), k.detach(), v.detach(), upcast=False, **opts)
    assert_close_fa_rule(out, ref_out, pt_out, "out")
    assert_close_fa_rule(lse, ref_lse, pt_lse, "lse")
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    _, ref_grads = attention_ref_backward(q, k, v, dout, **opts)
    _, pt_grads = attention_ref_backward(q, k, v, dout, upcast=False, **opts)
    for name, got, ref, pt in zip(("dq", "dk", "dv"), grads, ref_grads, pt_grads):
        assert torch.isfinite(got).all(), f"{name} is not finite"
        assert_close_fa_rule(got, ref, pt, name, atol=GRAD_ATOL)
    return out, lse, grads


MODS = {
    "softcap": dict(softcap=8.0),
    "alibi": dict(alibi=False),
    "alibi-per-batch": dict(alibi=True),
    "softcap+alibi": dict(softcap=8.0, alibi=True),
}
MASKS = {"full": (False, (-1, -1)), "causal": (False, (-1, 0)), "window": (False, (64, 16)),
         "causal-window": (True, (48, -1))}
SEQLENS = [(257, 257), (130, 301), (301, 130)]


def mod_args(mod, batch, nheads):
    spec = MODS[mod]
    slopes = alibi_slopes_for(batch, nheads, spec["alibi"]) if "alibi" in spec else None
    return dict(softcap=spec.get("softcap", 0.0), alibi_slopes=slopes)


@pytest.mark.parametrize("seqlen_q, seqlen_k", SEQLENS)
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("mod", list(MODS))
@pytest.mark.parametrize("dispatch", DISPATCHES)
def test_score_mods(dispatch, mod, dtype_name, mask, seqlen_q, seqlen_k):
    require_built(128, dtype_name)
    # Scores of a few units (q scaled by 3): a softcap of 8 bends them.
    q, k, v = rand_qkv(2, seqlen_q, seqlen_k, 6, 2, 128, DTYPES[dtype_name], scale=3.0 ** 0.5)
    causal, window_size = MASKS[mask]
    with dispatch_limit(dispatch):
        check(q, k, v, causal=causal, window_size=window_size, **mod_args(mod, 2, 6))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", list(_checks.SUPPORTED_HEAD_DIMS))
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("dispatch", DISPATCHES)
def test_score_mods_every_head_dim(dispatch, dtype_name, head_dim, causal):
    require_built(head_dim, dtype_name)
    q, k, v = rand_qkv(2, 333, 517, 8, 2, head_dim, DTYPES[dtype_name], scale=2.0)
    with dispatch_limit(dispatch):
        check(q, k, v, causal=causal, **mod_args("softcap+alibi", 2, 8))


def test_softcap_that_binds():
    """A softcap of 1 against scores of tens: every score is bent into
    (-1, 1), and the rows come out nearly uniform, as tanh makes them."""
    require_built(64, "bf16")
    q, k, v = rand_qkv(1, 200, 300, 4, 4, 64, torch.bfloat16, scale=3.0)
    out, lse, _ = check(q, k, v, softcap=1.0)
    # Every capped score lies in (-1, 1), so each lse is within 1 of log(seqlen_k).
    assert ((lse - torch.log(torch.tensor(300.0))).abs() <= 1.0 + 1e-3).all()


def test_alibi_slopes_in_any_layout():
    """Slopes as a strided view (every other element) and as a transposed
    (batch, nheads) view give what their contiguous copies give."""
    require_built(64, "fp16")
    q, k, v = rand_qkv(3, 150, 170, 4, 2, 64, torch.float16)
    wide = alibi_slopes_for(3, 8, per_batch=False)
    strided = wide[::2]
    assert not strided.is_contiguous()
    check(q, k, v, alibi_slopes=strided)
    per_batch = alibi_slopes_for(3, 4, per_batch=True)
    transposed = per_batch.t().contiguous().t()
    assert transposed.stride() == (1, 3)
    out_t = flashtile.flash_attn_func(q, k, v, alibi_slopes=transposed)
    out_c = flashtile.flash_attn_func(q, k, v, alibi_slopes=per_batch.contiguous())
    assert torch.equal(out_t, out_c)


def test_zero_slopes_match_the_plain_kernel():
    """alibi_slopes of zeros runs the scoremod kernels with no bias: the
    same math as the sm80 plain kernels (on sm90 the plain forward runs the
    wgmma kernel, whose sums run in another order)."""
    require_built(128, "bf16")
    q, k, v = rand_qkv(2, 190, 190, 4, 4, 128, torch.bfloat16)
    with sm80_kernels_only():
        plain = flashtile.flash_attn_func(q, k, v, causal=True)
        zero = flashtile.flash_attn_func(q, k, v, causal=True, alibi_slopes=torch.zeros(4, device="cuda"))
    torch.testing.assert_close(zero, plain, atol=0, rtol=0)


def test_deterministic_backward_is_bitwise_reproducible():
    require_built(128, "bf16")
    q, k, v = rand_qkv(2, 300, 300, 4, 2, 128, torch.bfloat16, scale=2.0)
    args = mod_args("softcap+alibi", 2, 4)
    _, _, first = check(q, k, v, causal=True, deterministic=True, **args)
    out = flashtile.flash_attn_func(q, k, v, causal=True, deterministic=True, **args)
    torch.manual_seed(0)
    dout = torch.randn_like(out)
    runs = [torch.autograd.grad(flashtile.flash_attn_func(q, k, v, causal=True, deterministic=True, **args),
                                (q, k, v), dout) for _ in range(2)]
    for name, a, b in zip(("dq", "dk", "dv"), *runs):
        assert torch.equal(a, b), f"{name} differs between two deterministic runs"


def test_packed_functions_and_padded_head_dim():
    """qkvpacked and kvpacked pass softcap and alibi_slopes through, and a
    head dim without a kernel of its own (80, padded to 96) keeps them."""
    require_built(96, "bf16")
    batch, seqlen, nheads, head_dim = 2, 211, 4, 80
    args = mod_args("softcap+alibi", batch, nheads)
    qkv = torch.randn(batch, seqlen, 3, nheads, head_dim, device="cuda", dtype=torch.bfloat16)
    q, k, v = (t.detach() for t in qkv.unbind(dim=2))
    ref_out, _ = attention_ref(q, k, v, causal=True, **args)
    pt_out, _ = attention_ref(q, k, v, causal=True, upcast=False, **args)
    assert_close_fa_rule(flashtile.flash_attn_qkvpacked_func(qkv, causal=True, **args), ref_out, pt_out, "qkvpacked")
    kv = qkv[:, :, 1:]
    assert_close_fa_rule(flashtile.flash_attn_kvpacked_func(q, kv, causal=True, **args), ref_out, pt_out, "kvpacked")
    q, k, v = rand_qkv(batch, seqlen, seqlen, nheads, nheads, head_dim, torch.bfloat16)
    check(q, k, v, causal=True, **args)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_negative_alibi_slopes(dtype_name):
    """Negative slopes make far scores larger, not smaller; seqlen_q not a
    multiple of the tile leaves padding rows in the backward's last query
    block, where such a bias once overflowed P into inf · 0 = NaN."""
    require_built(128, dtype_name)
    q, k, v = rand_qkv(2, 201, 230, 4, 2, 128, DTYPES[dtype_name])
    slopes = -torch.rand(2, 4, device="cuda") * 0.5
    check(q, k, v, alibi_slopes=slopes)
    check(q, k, v, causal=True, alibi_slopes=slopes, deterministic=True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sm90_backward_with_score_mods_is_the_kernel_that_runs(causal):
    """On an sm90 device softcap and ALiBi's backward runs the warp-specialized
    kernel's scoremod variant where it is built (every head dim),
    with gradients as the reference's; dropout runs the sm80 kernels."""
    require_sm90("bwd")
    pairs = sm90_built("bwd", "scoremod")
    if not pairs:
        pytest.skip("this build has no sm90 scoremod backward (FLASHTILE_VARIANTS)")
    for head_dim, name in pairs:
        q, k, v = rand_qkv(2, 190, 250, 4, 2, head_dim, DTYPES[name], scale=2.0)
        args = mod_args("softcap+alibi", 2, 4)
        _, names = cuda_kernel_names(lambda: check(q, k, v, causal=causal, **args))
        assert any("flashtile::sm90::bwd_ws_kernel" in n for n in names), (head_dim, names)
        assert not any("flashtile::sm80::bwd_dkdv_kernel" in n for n in names), (head_dim, names)
        if (head_dim, name) in BUILT:
            out = flashtile.flash_attn_func(q, k, v, dropout_p=0.1, causal=causal, **args)
            _, names = cuda_kernel_names(lambda: torch.autograd.grad(out, (q, k, v), torch.randn_like(out)))
            assert any("flashtile::sm80::bwd_dkdv_kernel" in n for n in names), (head_dim, names)
