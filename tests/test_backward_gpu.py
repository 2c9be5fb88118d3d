"""GPU tests of the backward against the float32 reference (FlashAttention's rule).

Gradients come from autograd through the public functions (the custom op
``flashtile::fwd`` with its registered backward, ``flashtile::bwd``) for a
random ``dout``; the reference is autograd through ``attention_ref`` on float32
leaf copies, and PyTorch's own error is the same autograd in the input dtype.
Every gradient must satisfy max|flashtile - ref| <= 2 * max|pytorch - ref| +
a small slack.

The parametrizations cover rather than multiply, as in test_forward_gpu.py:
every seqlen pair on one configuration, every (dtype, head dim, head grouping)
on one medium size, then single tests for batch 7, layouts, packing, partial
requires_grad, rows that see no key, torch.compile, ``deterministic`` and the
activation memory at long sequence lengths. Combinations whose backward is
missing from this build's kernel table are skipped with a reason.
"""

import itertools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

import flashtile
from flashtile import _C, _checks
from kernel_names import cuda_kernel_names, forced_smem_budget, require_sm90, sm90_built
from reference import assert_close_fa_rule, attention_ref, attention_ref_backward

KERNEL_HEAD_DIMS = list(_checks.SUPPORTED_HEAD_DIMS)  # each has a kernel of its own

BUILT_KERNELS = tuple(tuple(entry) for entry in _C.built_kernels())
FWD_BUILT = _checks.fwd_combos(BUILT_KERNELS)
BWD_BUILT = _checks.kernel_combos(BUILT_KERNELS, "bwd")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

# FlashAttention's absolute slack on top of 2x PyTorch's error.
GRAD_ATOL = 1e-5
# With a single key the softmax is constant, so dq and dk are exactly 0, and
# PyTorch's low-precision autograd cancels to exactly 0 as well: the rule then
# leaves only the slack, while the kernel's dS = P * (dP - D) keeps the fp32
# rounding of two dot products of length headdim (~1e-6..1e-5 after the
# reduction over query rows). Any real bug there is orders of magnitude larger.
GRAD_ATOL_ONE_KEY = 1e-4


def require_built(head_dim, dtype):
    combo = (head_dim, DTYPE_NAMES[dtype])
    if combo not in FWD_BUILT or combo not in BWD_BUILT:
        pytest.skip(f"hdim{head_dim}/{DTYPE_NAMES[dtype]} forward+backward is not in this build "
                    f"(forward: {FWD_BUILT}, backward: {BWD_BUILT})")


def default_config():
    """One built (head_dim, dtype) for the tests that sweep something else."""
    for head_dim, name in ((128, "bf16"), (64, "bf16"), (128, "fp16"), (64, "fp16")):
        if (head_dim, name) in FWD_BUILT and (head_dim, name) in BWD_BUILT:
            return head_dim, DTYPES[name]
    pytest.skip(f"no forward+backward kernel pair in this build "
                f"(forward: {FWD_BUILT}, backward: {BWD_BUILT})")


def rand_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, requires_grad=True):
    q = torch.randn(batch, seqlen_q, nheads, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, seqlen_k, nheads_k, head_dim, device="cuda", dtype=dtype)
    v = torch.randn(batch, seqlen_k, nheads_k, head_dim, device="cuda", dtype=dtype)
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v))


def poison_allocator(*likes):
    """Best effort: leave NaN-filled blocks of the backward's allocation sizes
    (one per gradient, and an fp32 one twice q's size for the dq accumulator)
    in torch's caching allocator, so that an element the backward forgets to
    write reads NaN rather than stale finite data."""
    shapes = [(t.shape, t.dtype) for t in likes] + [(likes[0].shape, torch.float32)]
    blocks = [torch.full(shape, float("nan"), dtype=dtype, device="cuda") for shape, dtype in shapes]
    del blocks


def flash_grads(out, inputs, dout):
    """Gradients of out for the cotangent dout, with NaN-poisoned free memory."""
    poison_allocator(*inputs)
    return torch.autograd.grad(out, inputs, dout)


def check_grads(q, k, v, dout, out, grads, causal, softmax_scale=None, contiguous=True,
                names=("dq", "dk", "dv")):
    """out and each gradient not None against the reference, by the FA rule."""
    ref_out, ref_grads = attention_ref_backward(q, k, v, dout, causal, softmax_scale)
    pt_out, pt_grads = attention_ref_backward(q, k, v, dout, causal, softmax_scale, upcast=False)
    assert_close_fa_rule(out, ref_out, pt_out, "out")
    atol = GRAD_ATOL_ONE_KEY if k.shape[1] == 1 else GRAD_ATOL
    for name, got, ref, pt, like in zip(names, grads, ref_grads, pt_grads, (q, k, v)):
        if got is None:
            continue
        assert got.dtype == like.dtype, f"{name}: dtype {got.dtype}, expected {like.dtype}"
        assert got.shape == like.shape, f"{name}: shape {tuple(got.shape)}, expected {tuple(like.shape)}"
        if contiguous:
            assert got.is_contiguous(), f"{name} is not contiguous: strides {got.stride()}"
        assert_close_fa_rule(got, ref, pt, name, atol=atol)


def run_and_check(q, k, v, causal, softmax_scale=None, dout=None, deterministic=False):
    out = flashtile.flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal,
                                    deterministic=deterministic)
    if dout is None:
        dout = torch.randn_like(out)
    grads = flash_grads(out, (q, k, v), dout)
    check_grads(q, k, v, dout, out, grads, causal, softmax_scale)
    return out, grads


def assert_close_up_to_atomics(got, want, name):
    """Equal up to the order of fp32 atomic adds (dq): each value may move by
    an ulp of its dtype when rounded, plus a sliver of the largest value for
    sums that cancel."""
    eps = torch.finfo(want.dtype).eps
    atol = eps * want.abs().max().item() / 16
    torch.testing.assert_close(got, want, rtol=2 * eps, atol=atol,
                               msg=lambda m: f"{name}: {m}")


# --------------------------------------------------------------------------
# numerics
# --------------------------------------------------------------------------

SEQLEN_PAIRS = [(1, 1), (1, 17), (17, 1), (17, 113), (113, 17), (257, 257), (1, 2049),
                (1023, 2049), (2049, 1023)]


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q, seqlen_k", SEQLEN_PAIRS)
def test_grads_seqlens(seqlen_q, seqlen_k, causal, deterministic):
    head_dim, dtype = default_config()
    # batch 1 and 4 heads keep the fp32 reference at 2049 x 1023 small (~35 MB a score tensor)
    q, k, v = rand_qkv(1, seqlen_q, seqlen_k, 4, 2, head_dim, dtype)
    run_and_check(q, k, v, causal, deterministic=deterministic)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("nheads, nheads_k", [(4, 4), (8, 2), (16, 2), (8, 1)],
                         ids=["mha", "gqa4", "gqa8", "mqa"])
@pytest.mark.parametrize("head_dim", KERNEL_HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_grads_dtype_headdim_grouping(dtype, head_dim, nheads, nheads_k, causal):
    require_built(head_dim, dtype)
    q, k, v = rand_qkv(2, 257, 400, nheads, nheads_k, head_dim, dtype)
    run_and_check(q, k, v, causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(17, 113), (113, 17)])
def test_grads_batch7(seqlen_q, seqlen_k, causal):
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(7, seqlen_q, seqlen_k, 8, 2, head_dim, dtype)
    run_and_check(q, k, v, causal)


@pytest.mark.parametrize("softmax_scale", [0.5, 0.05])
def test_grads_softmax_scale(softmax_scale):
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 130, 190, 4, 2, head_dim, dtype)
    run_and_check(q, k, v, True, softmax_scale)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_grads_large_logits(causal):
    """Scores with a spread of tens: P = exp(S - lse) must use the forward's lse exactly."""
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 300, 515, 4, 2, head_dim, dtype, requires_grad=False)
    q = (q * 6).requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    run_and_check(q, k, v, causal)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("head_dim", KERNEL_HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(113, 17), (300, 129)])
def test_rows_without_keys(seqlen_q, seqlen_k, dtype, head_dim, deterministic):
    """Causal with seqlen_q > seqlen_k: the first seqlen_q - seqlen_k query rows
    see no key (lse -inf, out 0). Their P must be 0, not exp(-inf + inf) = NaN:
    every gradient finite, dq exactly 0 on those rows; in deterministic mode
    the dQ kernel's blocks that see no key block write those zeros."""
    require_built(head_dim, dtype)
    q, k, v = rand_qkv(2, seqlen_q, seqlen_k, 4, 2, head_dim, dtype)
    out = flashtile.flash_attn_func(q, k, v, causal=True, deterministic=deterministic)
    dout = torch.randn_like(out)
    dq, dk, dv = flash_grads(out, (q, k, v), dout)
    empty = seqlen_q - seqlen_k
    assert (out[:, :empty] == 0).all(), "out rows that see no key must be 0"
    for name, g in (("dq", dq), ("dk", dk), ("dv", dv)):
        n_bad = int((~torch.isfinite(g)).sum())
        assert n_bad == 0, f"{name}: {n_bad} of {g.numel()} elements are NaN or inf"
    assert (dq[:, :empty] == 0).all(), (
        f"dq rows that see no key must be 0; max |dq| there {dq[:, :empty].abs().max().item():.3e}"
    )
    check_grads(q, k, v, dout, out, (dq, dk, dv), causal=True)


def test_repeated_runs_agree():
    """dK/dV accumulate in registers, one CTA per key block walking its query
    heads (bwd_kernel.hpp), so they repeat bit for bit; dQ sums fp32 atomics,
    whose order varies, so it may move by an ulp and no more. A larger move is
    a race."""
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 1023, 1023, 8, 2, head_dim, dtype)
    dout = torch.randn(2, 1023, 8, head_dim, device="cuda", dtype=dtype)
    first = flash_grads(flashtile.flash_attn_func(q, k, v, causal=True), (q, k, v), dout)
    for _ in range(3):
        again = flash_grads(flashtile.flash_attn_func(q, k, v, causal=True), (q, k, v), dout)
        assert_close_up_to_atomics(again[0], first[0], "dq")
        assert torch.equal(again[1], first[1]), "dk differs between identical runs"
        assert torch.equal(again[2], first[2]), "dv differs between identical runs"


# --------------------------------------------------------------------------
# layouts, packing, partial requires_grad
# --------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_grads_non_contiguous_views(causal):
    head_dim, dtype = default_config()
    b, sq, sk, h, hk = 2, 131, 257, 4, 2
    rand = lambda *shape: torch.randn(*shape, device="cuda", dtype=dtype)
    # detach() keeps the view's strides and makes it a leaf of its own
    q = rand(b, sq, 3 * h, head_dim)[:, :, h : 2 * h].detach().requires_grad_()  # heads slice
    k = rand(b, hk, sk, head_dim).transpose(1, 2).detach().requires_grad_()     # (b, h, s, d)
    v = rand(sk, b, hk, head_dim).transpose(0, 1).detach().requires_grad_()     # (s, b, h, d)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    run_and_check(q, k, v, causal)


DOUT_LAYOUTS = ["transposed", "strided_heads", "odd_strides", "broadcast", "sum"]


@pytest.mark.parametrize("layout", DOUT_LAYOUTS)
def test_grads_non_contiguous_dout(layout):
    """dout is whatever autograd hands over: any strides, even stride 0
    (out.sum() gives ones expanded with all strides 0)."""
    head_dim, dtype = default_config()
    b, sq, sk, h, hk = 2, 131, 257, 4, 2
    q, k, v = rand_qkv(b, sq, sk, h, hk, head_dim, dtype)
    rand = lambda *shape: torch.randn(*shape, device="cuda", dtype=dtype)
    out = flashtile.flash_attn_func(q, k, v, causal=True)
    if layout == "sum":
        dout = torch.ones_like(out)
        poison_allocator(q, k, v)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
    else:
        if layout == "transposed":      # (b, h, s, d) storage
            dout = rand(b, h, sq, head_dim).transpose(1, 2)
        elif layout == "strided_heads":  # every other head of a wider tensor
            dout = rand(b, sq, 2 * h, head_dim)[:, :, ::2]
        elif layout == "odd_strides":    # strides not a multiple of 16 bytes
            dout = rand(b, sq, h, head_dim + 3)[..., :head_dim]
        else:                            # "broadcast": one row for all (b, s), stride 0
            dout = rand(h, head_dim).expand(b, sq, h, head_dim)
        assert not dout.is_contiguous() and dout.stride(-1) == 1
        grads = flash_grads(out, (q, k, v), dout)
    check_grads(q, k, v, dout, out, grads, causal=True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_grads_qkvpacked(causal):
    """The gradient is one tensor of qkv's shape (q, k and v are strided views)."""
    head_dim, dtype = default_config()
    qkv = torch.randn(2, 300, 3, 4, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    out = flashtile.flash_attn_qkvpacked_func(qkv, causal=causal)
    dout = torch.randn_like(out)
    (dqkv,) = flash_grads(out, (qkv,), dout)
    assert dqkv.shape == qkv.shape and dqkv.dtype == qkv.dtype
    check_grads(*qkv.unbind(2), dout, out, dqkv.unbind(2), causal, contiguous=False,
                names=("dqkv[:, :, 0]", "dqkv[:, :, 1]", "dqkv[:, :, 2]"))


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [8, 40, 63, 72, 100, 120, 136, 200, 250])
def test_padded_head_dims(head_dim, causal, deterministic):
    """A head dim without a kernel of its own runs the next one up on
    zero-padded q, k, v: out (a view of the first head_dim columns), lse and
    gradients against the reference at the caller's head dim."""
    _, dtype = default_config()
    require_built(_checks.kernel_head_dim(head_dim), dtype)
    q, k, v = rand_qkv(2, 129, 200, 4, 2, head_dim, dtype)
    out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic,
                                            return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (2, 4, 129)
    _, ref_lse = attention_ref(q.detach(), k.detach(), v.detach(), causal=causal)
    _, pt_lse = attention_ref(q.detach(), k.detach(), v.detach(), causal=causal, upcast=False)
    assert_close_fa_rule(lse, ref_lse, pt_lse, "lse")
    dout = torch.randn_like(out)
    grads = flash_grads(out, (q, k, v), dout)
    check_grads(q, k, v, dout, out, grads, causal, contiguous=False)


def test_padded_head_dim_through_qkvpacked():
    _, dtype = default_config()
    require_built(64, dtype)
    qkv = torch.randn(2, 150, 3, 4, 40, device="cuda", dtype=dtype, requires_grad=True)
    out = flashtile.flash_attn_qkvpacked_func(qkv, causal=True)
    dout = torch.randn_like(out)
    (dqkv,) = flash_grads(out, (qkv,), dout)
    assert dqkv.shape == qkv.shape
    check_grads(*qkv.unbind(2), dout, out, dqkv.unbind(2), True, contiguous=False,
                names=("dqkv[:, :, 0]", "dqkv[:, :, 1]", "dqkv[:, :, 2]"))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_grads_kvpacked(causal):
    head_dim, dtype = default_config()
    q = torch.randn(2, 200, 8, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    kv = torch.randn(2, 333, 2, 2, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    out = flashtile.flash_attn_kvpacked_func(q, kv, causal=causal)
    dout = torch.randn_like(out)
    dq, dkv = flash_grads(out, (q, kv), dout)
    assert dkv.shape == kv.shape and dkv.dtype == kv.dtype
    assert dq.is_contiguous()
    k, v = kv.unbind(2)
    check_grads(q, k, v, dout, out, (dq, *dkv.unbind(2)), causal, contiguous=False,
                names=("dq", "dkv[:, :, 0]", "dkv[:, :, 1]"))


@pytest.mark.parametrize("which", ["q", "k", "v", "kv"])
def test_requires_grad_on_some_inputs(which):
    """Only the inputs that require grad get one; the others stay plain tensors."""
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 177, 230, 8, 2, head_dim, dtype, requires_grad=False)
    inputs = {"q": q, "k": k, "v": v}
    for name in which:
        inputs[name].requires_grad_()
    out = flashtile.flash_attn_func(q, k, v, causal=True)
    assert out.requires_grad
    dout = torch.randn_like(out)
    poison_allocator(q, k, v)
    out.backward(dout)
    for name, t in inputs.items():
        if name in which:
            assert t.grad is not None, f"{name} requires grad but got none"
        else:
            assert t.grad is None, f"{name} does not require grad but got one"
    check_grads(q, k, v, dout, out, (q.grad, k.grad, v.grad), causal=True)


# --------------------------------------------------------------------------
# torch integration: custom ops, torch.compile, deterministic, missing kernels
# --------------------------------------------------------------------------


def test_opcheck_fwd_with_grad():
    """The autograd registration of flashtile::fwd, also under AOTDispatcher."""
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 65, 130, 4, 2, head_dim, dtype)
    eps = torch.finfo(dtype).eps
    torch.library.opcheck(torch.ops.flashtile.fwd.default, (q, k, v, 0.1, True, False),
                          rtol=2 * eps, atol=1e-3)


def test_fwd_op_records_autograd_only_in_grad_mode():
    """flashtile::fwd's out carries FlashAttentionFunction's backward in grad
    mode; under no_grad the op skips the autograd.Function, same results."""
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(1, 33, 40, 2, 2, head_dim, dtype)
    out, lse, _ = torch.ops.flashtile.fwd(q, k, v, 0.5, False)
    assert type(out.grad_fn).__name__ == "FlashAttentionFunctionBackward" and not lse.requires_grad
    with torch.no_grad():
        out_no_grad, lse_no_grad, _ = torch.ops.flashtile.fwd(q, k, v, 0.5, False)
    assert out_no_grad.grad_fn is None and not out_no_grad.requires_grad
    assert torch.equal(out, out_no_grad) and torch.equal(lse, lse_no_grad)


class _OpsSeen(TorchDispatchMode):
    """Records the ops that reach the dispatcher's Python mode."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_public_functions_dispatch_only_where_something_watches():
    """In plain eager mode flash_attn_func calls the kernels without the
    dispatcher (its host time, benchmarks/NOTES.md); under a dispatch mode
    the ops flashtile::fwd and flashtile::bwd run and are seen. Same bits
    either way (deterministic backward)."""
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 70, 90, 4, 2, head_dim, dtype)
    dout = torch.randn_like(q)
    out = flashtile.flash_attn_func(q, k, v, causal=True, deterministic=True)
    assert type(out.grad_fn).__name__ == "EagerFlashAttentionFunctionBackward"
    grads = torch.autograd.grad(out, (q, k, v), dout)
    with _OpsSeen() as seen:
        out_op = flashtile.flash_attn_func(q, k, v, causal=True, deterministic=True)
        grads_op = torch.autograd.grad(out_op, (q, k, v), dout)
    assert type(out_op.grad_fn).__name__ == "FlashAttentionFunctionBackward"
    assert "flashtile.fwd.default" in seen.ops and "flashtile.bwd.default" in seen.ops
    assert torch.equal(out, out_op)
    for g, g_op in zip(grads, grads_op):
        assert torch.equal(g, g_op)


def test_double_backward_raises():
    """flashtile::bwd has no derivative: a second backward through it says so
    instead of returning wrong second derivatives."""
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(1, 33, 33, 2, 2, head_dim, dtype)
    out = flashtile.flash_attn_func(q, k, v)
    dq, = torch.autograd.grad(out.float().square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        dq.float().sum().backward()


@pytest.mark.parametrize("deterministic", [False, True])
def test_opcheck_bwd(deterministic):
    """flashtile::bwd's schema and fake (GQA: dk, dv with nheads_k heads), on a strided dout."""
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 65, 130, 8, 2, head_dim, dtype, requires_grad=False)
    out, lse, _ = torch.ops.flashtile.fwd(q, k, v, 0.1, True, deterministic)
    dout = torch.randn(2, 8, 65, head_dim, device="cuda", dtype=dtype).transpose(1, 2)
    dq, dk, dv = torch.ops.flashtile.bwd(dout, q, k, v, out, lse, 0.1, True, deterministic)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    eps = torch.finfo(dtype).eps
    torch.library.opcheck(torch.ops.flashtile.bwd.default,
                          (dout, q, k, v, out, lse, 0.1, True, deterministic),
                          rtol=2 * eps, atol=1e-3)


def test_torch_compile_fullgraph_grads_match_eager():
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 257, 300, 8, 2, head_dim, dtype)
    kv = torch.randn(2, 300, 2, 2, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    qkv = torch.randn(2, 129, 3, 4, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    d1 = torch.randn(2, 257, 8, head_dim, device="cuda", dtype=dtype)
    d2 = torch.randn_like(d1)
    d3 = torch.randn(2, 129, 4, head_dim, device="cuda", dtype=dtype)
    leaves = (q, k, v, kv, qkv)

    def loss_fn(q, k, v, kv, qkv):
        out = flashtile.flash_attn_func(q * 0.5, k, v, causal=True)
        out_kv = flashtile.flash_attn_kvpacked_func(q, kv)
        out_qkv = flashtile.flash_attn_qkvpacked_func(qkv, softmax_scale=0.2, causal=True)
        return (out * d1).sum() + (out_kv * d2).sum() + (out_qkv * d3).sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss_fn, fullgraph=True)
    got = torch.autograd.grad(compiled(*leaves), leaves)
    want = torch.autograd.grad(loss_fn(*leaves), leaves)
    for name, g, w in zip(("dq", "dk", "dv", "dkv", "dqkv"), got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        assert_close_up_to_atomics(g, w, name)


def built_pairs():
    return [(hd, DTYPES[name]) for hd, name in BWD_BUILT if (hd, name) in FWD_BUILT]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim,dtype", built_pairs(), ids=lambda x: str(x).removeprefix("torch."))
def test_deterministic_backward_is_bitwise_repeatable(head_dim, dtype, causal):
    """deterministic=True: two backward passes give identical bits (odd sizes,
    GQA, seqlen_q != seqlen_k, several key blocks per query block and the
    reverse), and the gradients satisfy the rule."""
    q, k, v = rand_qkv(2, 301, 517, 8, 2, head_dim, dtype)
    dout = torch.randn(2, 301, 8, head_dim, device="cuda", dtype=dtype)
    runs = []
    for _ in range(2):
        out = flashtile.flash_attn_func(q, k, v, causal=causal, deterministic=True)
        runs.append((out, flash_grads(out, (q, k, v), dout)))
    (out, grads), (out2, grads2) = runs
    assert torch.equal(out, out2)
    for name, g, g2 in zip(("dq", "dk", "dv"), grads, grads2):
        assert torch.equal(g, g2), f"{name} differs between two deterministic runs"
    check_grads(q, k, v, dout, out, grads, causal)


@pytest.mark.parametrize("api", ["func", "qkvpacked", "kvpacked"])
def test_deterministic_through_every_api(api):
    """Each public function's deterministic=True reaches the backward: its
    gradients equal, bit for bit, those of flashtile::bwd called directly with
    deterministic=True. The default mode's atomic adds sum dq in another order
    (the mma.sync path: 128-key partials, not 64-key blocks; the
    warp-specialized one: the key blocks as they come, mostly the last first,
    where the deterministic mode adds them first to last), so with five key
    blocks a dropped flag changes the bits (two partials add the same either
    way)."""
    head_dim, dtype = default_config()
    qkv = torch.randn(2, 577, 3, 4, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    dout = torch.randn(2, 577, 4, head_dim, device="cuda", dtype=dtype)
    q, k, v = qkv.detach().unbind(2)
    scale = head_dim ** -0.5
    out, lse, _ = torch.ops.flashtile.fwd(q, k, v, scale, True, True)
    want = torch.stack(torch.ops.flashtile.bwd(dout, q, k, v, out, lse, scale, True, True), dim=2)

    if api == "func":
        got_out = flashtile.flash_attn_func(*qkv.unbind(2), causal=True, deterministic=True)
    elif api == "qkvpacked":
        got_out = flashtile.flash_attn_qkvpacked_func(qkv, causal=True, deterministic=True)
    else:
        got_out = flashtile.flash_attn_kvpacked_func(qkv[:, :, 0], qkv[:, :, 1:], causal=True,
                                                     deterministic=True)
    (got,) = torch.autograd.grad(got_out, (qkv,), dout)
    assert torch.equal(got_out, out)
    for i, name in enumerate(("dq", "dk", "dv")):
        assert torch.equal(got[:, :, i], want[:, :, i]), f"{name} differs from flashtile::bwd(deterministic)"


def test_backward_kernel_not_built_is_named():
    missing = [combo for combo in FWD_BUILT if combo not in BWD_BUILT]
    if not missing:
        pytest.skip(f"every forward kernel of this build has its backward (backward: {BWD_BUILT})")
    head_dim, name = missing[0]
    q, k, v = rand_qkv(1, 33, 33, 4, 4, head_dim, DTYPES[name], requires_grad=False)
    q.requires_grad_()
    with pytest.raises(RuntimeError) as info:
        flashtile.flash_attn_func(q, k, v).sum().backward()
    message = str(info.value)
    assert str(head_dim) in message and name in message, message


# --------------------------------------------------------------------------
# the warp-specialized wgmma + TMA backward (include/flashtile/sm90/bwd_ws_kernel.hpp)
# --------------------------------------------------------------------------

SM90_BWD_BUILT = sm90_built("bwd")


def require_sm90_backward():
    require_sm90("bwd")


def backward_kernel_names(q, k, v, causal, deterministic=False):
    """The CUDA kernels one forward + backward launches, by name."""
    out = flashtile.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
    dout = torch.randn_like(out)
    return cuda_kernel_names(lambda: torch.autograd.grad(out, (q, k, v), dout))[1]


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sm90_backward_is_the_kernel_that_runs(causal, deterministic):
    """On an sm90 device the plain backward of an sm90-built head dim runs the
    warp-specialized kernel, and every other head dim the sm80 one; the other
    tests of this file then check its gradients at those head dims."""
    require_sm90_backward()
    for head_dim, name in SM90_BWD_BUILT:
        q, k, v = rand_qkv(1, 200, 200, 2, 2, head_dim, DTYPES[name])
        names = backward_kernel_names(q, k, v, causal, deterministic)
        assert any("flashtile::sm90::bwd_ws_kernel" in n for n in names), (head_dim, names)
        assert not any("flashtile::sm80::bwd_dkdv_kernel" in n for n in names), names
        # dQ comes from the warp-specialized kernel in both modes (in turns
        # when deterministic), then its conversion; no dQ kernel.
        assert not any("bwd_dq_kernel" in n for n in names), (head_dim, names)
        assert any("bwd_convert_dq_kernel" in n for n in names), (head_dim, names)
    others = [combo for combo in BWD_BUILT if combo not in SM90_BWD_BUILT and combo in FWD_BUILT]
    if others:
        head_dim, name = others[0]
        q, k, v = rand_qkv(1, 200, 200, 2, 2, head_dim, DTYPES[name])
        names = backward_kernel_names(q, k, v, causal, deterministic)
        assert any("flashtile::sm80::bwd_dkdv_kernel" in n for n in names), names


def test_sm90_backward_without_tma_runs_sm80():
    """A dout TMA cannot read (stride 0, what out.sum() hands over) runs the
    SM80 kernels, which take any strides, with correct gradients; a
    contiguous one the TMA kernel."""
    require_sm90_backward()
    pairs = [(hd, name) for hd, name in SM90_BWD_BUILT if (hd, name) in BWD_BUILT and (hd, name) in FWD_BUILT]
    if not pairs:
        pytest.skip(f"no warp-specialized backward with an SM80 one beside it (sm90: {SM90_BWD_BUILT})")
    for head_dim, name in pairs:
        q, k, v = rand_qkv(2, 150, 190, 4, 2, head_dim, DTYPES[name])
        out = flashtile.flash_attn_func(q, k, v, causal=True)
        dout = torch.randn(4, head_dim, device="cuda", dtype=q.dtype).expand(2, 150, 4, head_dim)
        grads, names = cuda_kernel_names(lambda: flash_grads(out, (q, k, v), dout))
        assert any("flashtile::sm80::bwd_dkdv_kernel" in n for n in names), (head_dim, names)
        assert not any("flashtile::sm90::" in n for n in names), (head_dim, names)
        check_grads(q, k, v, dout, out, grads, causal=True)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q, seqlen_k", SEQLEN_PAIRS)
def test_sm90_backward_seqlens(seqlen_q, seqlen_k, causal, deterministic):
    """test_grads_seqlens at the wgmma backward's head dims: partial and
    single blocks, more queries than keys and the reverse."""
    require_sm90_backward()
    for head_dim, name in SM90_BWD_BUILT:
        q, k, v = rand_qkv(1, seqlen_q, seqlen_k, 4, 2, head_dim, DTYPES[name])
        run_and_check(q, k, v, causal, deterministic=deterministic)


@pytest.mark.parametrize("seqused", [False, True], ids=["all-keys", "seqused_k"])
@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)), (False, (300, 70))],
                         ids=["full", "causal", "window"])
def test_sm90_deterministic_dq_in_turns(causal, window, seqused):
    """The warp-specialized backward's deterministic mode, where the key
    blocks that see a query block add its dQ one after another
    (sm90/dq_turns.hpp): a varlen batch of sequences of up to 9 key blocks
    (one of a single query), GQA, a window, seqused_k. The first and last
    sequences hold the same data at different places in the grid: their
    gradients must be equal bit for bit (with the adds in arrival order they
    differ), as must three runs; and the gradients equal the default mode's
    up to the order of fp32 sums (which the other tests hold to the float64
    reference)."""
    require_sm90_backward()
    seqlens_q, seqlens_k = [1030, 1, 389, 700, 1030], [1100, 5, 389, 640, 1100]
    cu_q = torch.tensor([0, *itertools.accumulate(seqlens_q)], device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(seqlens_k)], device="cuda", dtype=torch.int32)
    used_k = torch.tensor([1000, 5, 300, 640, 1000], device="cuda", dtype=torch.int32) if seqused else None
    first_q, last_q = slice(0, seqlens_q[0]), slice(cu_q[-2].item(), cu_q[-1].item())
    first_k, last_k = slice(0, seqlens_k[0]), slice(cu_k[-2].item(), cu_k[-1].item())
    for head_dim, name in SM90_BWD_BUILT:
        dtype = DTYPES[name]
        q = torch.randn(sum(seqlens_q), 8, head_dim, device="cuda", dtype=dtype)
        k = torch.randn(sum(seqlens_k), 2, head_dim, device="cuda", dtype=dtype)
        v = torch.randn(sum(seqlens_k), 2, head_dim, device="cuda", dtype=dtype)
        dout = torch.randn_like(q)
        for t, first, last in ((q, first_q, last_q), (k, first_k, last_k), (v, first_k, last_k), (dout, first_q, last_q)):
            t[last] = t[first]
        q, k, v = (t.requires_grad_() for t in (q, k, v))

        def grads(deterministic):
            out = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k),
                                                   causal=causal, window_size=window,
                                                   deterministic=deterministic, seqused_k=used_k)
            return flash_grads(out, (q, k, v), dout)

        runs, names = cuda_kernel_names(lambda: [grads(True) for _ in range(3)])
        assert any("flashtile::sm90::bwd_ws_kernel" in n for n in names), names
        for run in runs[1:]:
            for label, got, want in zip(("dq", "dk", "dv"), run, runs[0]):
                assert torch.equal(got, want), f"hdim{head_dim}/{name} {label} differs between deterministic runs"
        for label, g, (first, last) in zip(("dq", "dk", "dv"), runs[0],
                                           ((first_q, last_q), (first_k, last_k), (first_k, last_k))):
            assert torch.equal(g[first], g[last]), f"hdim{head_dim}/{name} {label}: same sequence, other bits"
        for label, got, want in zip(("dq", "dk", "dv"), runs[0], grads(False)):
            assert_close_up_to_atomics(got, want, f"hdim{head_dim}/{name} {label}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sm90_deterministic_many_waves(causal):
    """The deterministic warp-specialized backward on a grid of several
    waves (32 key blocks × 32 heads against 132 SMs), where a key block may
    wait on one that is not resident yet unless the grid starts the key
    blocks it waits on first (sm90/dq_turns.hpp): it finishes (run it under a
    time limit: a wrong order hangs), two runs give the same bits, and the
    gradients equal the default mode's up to the order of fp32 sums."""
    require_sm90_backward()
    for head_dim, name in SM90_BWD_BUILT:
        q, k, v = rand_qkv(2, 4096, 4096, 16, 16, head_dim, DTYPES[name])
        dout = torch.randn_like(q)
        runs = []
        for deterministic in (True, True, False):
            out = flashtile.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
            runs.append(flash_grads(out, (q, k, v), dout))
        for label, got, again, atomic in zip(("dq", "dk", "dv"), *runs):
            assert torch.equal(got, again), f"hdim{head_dim}/{name} {label} differs between deterministic runs"
            assert_close_up_to_atomics(got, atomic, f"hdim{head_dim}/{name} {label}")


# --------------------------------------------------------------------------
# the SM80 main kernel's split tail (include/flashtile/sm80/bwd_tail_split.hpp)
# --------------------------------------------------------------------------


def sm80_plain_pairs():
    """The built (head_dim, dtype) pairs whose plain backward runs the SM80
    main kernel on this GPU."""
    sm90 = SM90_BWD_BUILT if torch.cuda.get_device_capability() == (9, 0) else ()
    return [combo for combo in BWD_BUILT if combo in FWD_BUILT and combo not in sm90]


# The 99 KB tiles of these head dims take dQ from the dQ kernel in every mode
# (sm80/bwd_traits.hpp, kDqOwnKernel): no dQ atomics, so no split tail.
DQ_KERNEL_ONLY_99 = (256,)


@pytest.mark.parametrize("nheads, nheads_k", [(3, 3), (6, 3)], ids=["mha", "gqa"])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1000, 700), (77, 300)])
def test_split_tail_gradients(seqlen_q, seqlen_k, nheads, nheads_k):
    """A grid of at most 3 · 11 key blocks (blocks of 64 or 128 keys) is
    under half a wave on a GPU of 66 SMs or more, so each key block is split
    across CTAs that sum dK and dV in the workspace (with 1000 query rows
    there are enough query blocks to split, and the kernel that writes the
    sums runs). The gradients pass the FA rule, and dk and dv equal the
    deterministic mode's, which never splits, up to the order of fp32 sums."""
    pairs = sm80_plain_pairs()
    if not pairs:
        pytest.skip(f"no SM80 plain backward in this build runs on this GPU (built: {BWD_BUILT})")
    splits_here = torch.cuda.get_device_properties(0).multi_processor_count >= 2 * nheads_k * 11
    for head_dim, name in pairs:
        q, k, v = rand_qkv(1, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, DTYPES[name])
        names = backward_kernel_names(q, k, v, causal=False)
        if forced_smem_budget() == 99 and head_dim in DQ_KERNEL_ONLY_99:
            assert any("bwd_dq_kernel" in n for n in names), (head_dim, name, names)
            assert not any("bwd_convert_dkv_tail_kernel" in n for n in names), (head_dim, name, names)
        elif seqlen_q == 1000 and splits_here:
            assert any("bwd_convert_dkv_tail_kernel" in n for n in names), (head_dim, name, names)
        run_and_check(q, k, v, causal=False)
        out = flashtile.flash_attn_func(q, k, v)
        dout = torch.randn_like(out)
        split_grads = flash_grads(out, (q, k, v), dout)
        out_det = flashtile.flash_attn_func(q, k, v, deterministic=True)
        det_grads = flash_grads(out_det, (q, k, v), dout)
        for label, got, want in zip(("dk", "dv"), split_grads[1:], det_grads[1:]):
            assert_close_up_to_atomics(got, want, f"hdim{head_dim}/{name} {label}")


# --------------------------------------------------------------------------
# memory: activations linear in seqlen
# --------------------------------------------------------------------------


@pytest.mark.parametrize("seqlen", [16384, 32768])
@pytest.mark.parametrize("head_dim", KERNEL_HEAD_DIMS)
def test_activation_memory_is_linear(record_property, head_dim, seqlen):
    """Forward + backward allocate O(seqlen) memory: the peak above the inputs
    stays within 3x the bytes of q, k, v, out, dout and their gradients plus
    the fp32 dq accumulator, far below one seqlen^2 score matrix."""
    dtype, nheads = torch.bfloat16, 4
    require_built(head_dim, dtype)
    q, k, v = rand_qkv(1, seqlen, seqlen, nheads, nheads, head_dim, dtype)
    dout = torch.randn_like(q)
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()

    out = flashtile.flash_attn_func(q, k, v, causal=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - baseline

    tensor_bytes = sum(t.nbytes for t in (q, k, v, out, dout, dq, dk, dv))
    bound = 3 * tensor_bytes + 2 * q.nbytes  # + the fp32 dq accumulator
    quadratic = seqlen * seqlen * nheads * 2  # one bf16 score matrix per head
    mib = 2.0 ** 20
    figures = (f"seqlen {seqlen}, hdim {head_dim}, {nheads} heads: peak above inputs "
               f"{peak / mib:.1f} MiB, bound {bound / mib:.1f} MiB (tensors {tensor_bytes / mib:.1f} "
               f"MiB), one seqlen^2 matrix {quadratic / mib:.0f} MiB")
    record_property("peak_above_inputs_MiB", round(peak / mib, 1))
    record_property("bound_MiB", round(bound / mib, 1))
    record_property("seqlen_sq_matrix_MiB", round(quadratic / mib))
    print(figures)
    assert bound < quadratic, f"the bound would not catch a seqlen^2 buffer: {figures}"
    assert peak <= bound, figures
    for name, g in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert torch.isfinite(g).all(), f"{name} holds NaN or inf at {figures}"

    # Spot check: with bottom-right causal masking the last rows of q form a
    # problem of their own (same keys visible), so their dq has a cheap reference.
    rows = 64
    ref_out, (ref_dq, _, _) = attention_ref_backward(q[:, -rows:], k, v, dout[:, -rows:], True)
    pt_out, (pt_dq, _, _) = attention_ref_backward(q[:, -rows:], k, v, dout[:, -rows:], True,
                                                   upcast=False)
    assert_close_fa_rule(out[:, -rows:], ref_out, pt_out, f"out (last {rows} rows)")
    assert_close_fa_rule(dq[:, -rows:], ref_dq, pt_dq, f"dq (last {rows} rows)", atol=GRAD_ATOL)
