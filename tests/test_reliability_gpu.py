"""GPU tests of behaviour at the edges: refusals that leave caller buffers
alone, NaN and inf inputs, huge logits, CUDA graphs, torch.compile of a model
block, streams and devices, tensors past 2^31 elements, empty and broadcast
inputs. Numerics use FlashAttention's rule against the float32 reference, as
in test_backward_gpu.py, whose helpers these reuse.
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

import flashtile
from flashtile import _C
from reference import assert_close_fa_rule, attention_ref, attention_ref_backward
from test_backward_gpu import (assert_close_up_to_atomics, check_grads, default_config, rand_qkv,
                               require_built, run_and_check)

# --------------------------------------------------------------------------
# the extension's entry points: refused before launch, outputs untouched
# --------------------------------------------------------------------------


def poisoned(*shape, dtype, offset_elems=0, strides=None):
    """A tensor of `shape` filled with a recognisable pattern (NaN-free, so
    torch.equal compares it), optionally at an element offset or with strides."""
    numel = 1
    for s in shape:
        numel *= s
    storage = torch.arange(numel * 4 + offset_elems + 64, device="cuda").remainder(251).to(dtype)
    if strides is None:
        strides = torch.empty(shape, device="meta").stride()
    return storage.as_strided(shape, strides, offset_elems)


def fwd_args(head_dim, dtype):
    q, k, v = rand_qkv(2, 33, 65, 4, 2, head_dim, dtype, requires_grad=False)
    out = poisoned(2, 33, 4, head_dim, dtype=dtype)
    lse = poisoned(2, 4, 33, dtype=torch.float32)
    return dict(q=q, k=k, v=v, out=out, lse=lse)


def call_fwd(a, softmax_scale=0.125, causal=True):
    stream = torch.cuda.current_stream().cuda_stream
    _C.fwd(a["q"], a["k"], a["v"], a["out"], a["lse"], softmax_scale, causal, stream, **a.get("options", {}))


def bwd_args(head_dim, dtype):
    q, k, v = rand_qkv(2, 33, 65, 4, 2, head_dim, dtype, requires_grad=False)
    out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    dout = torch.randn_like(out)
    a = dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse,
             dq=poisoned(*q.shape, dtype=dtype), dk=poisoned(*k.shape, dtype=dtype),
             dv=poisoned(*v.shape, dtype=dtype))
    # Sized for no mask, the largest (call_bwd may pass causal=False).
    a["workspace"] = torch.zeros(_C.bwd_workspace_bytes(2, 33, 65, 4, 2, head_dim, False, -1, -1, False),
                                 dtype=torch.uint8, device="cuda")
    return a


def call_bwd(a, softmax_scale=0.125, causal=True, deterministic=False):
    stream = torch.cuda.current_stream().cuda_stream
    _C.bwd(a["dout"], a["q"], a["k"], a["v"], a["out"], a["lse"], a["dq"], a["dk"], a["dv"],
           a["workspace"], softmax_scale, causal, deterministic, stream, **a.get("options", {}))


def _seed():
    return torch.zeros(1, dtype=torch.int64, device="cuda")


def other_half(t):
    return torch.float16 if t.dtype == torch.bfloat16 else torch.bfloat16


def _odd_head_stride(t):
    """The same values with a head stride of head_dim + 4 elements."""
    padded = torch.zeros(*t.shape[:-1], t.shape[-1] + 4, dtype=t.dtype, device="cuda")
    padded[..., :t.shape[-1]] = t
    return padded[..., :t.shape[-1]]


def _misaligned(t):
    flat = torch.empty(t.numel() + 8, dtype=t.dtype, device="cuda")
    view = flat[1:1 + t.numel()].view(t.shape)
    view.copy_(t)
    return view


FWD_REFUSALS = [
    ("out float32", lambda a: a.update(out=poisoned(*a["out"].shape, dtype=torch.float32)),
     ["out must be float16 or bfloat16"]),
    ("out of the other half dtype", lambda a: a.update(out=poisoned(*a["out"].shape, dtype=other_half(a["q"]))),
     ["share one dtype"]),
    ("lse float16", lambda a: a.update(lse=a["lse"].half()), ["lse must be float32"]),
    ("lse wrong shape", lambda a: a.update(lse=poisoned(2, 33, 4, dtype=torch.float32)), ["lse must have shape"]),
    ("lse not contiguous", lambda a: a.update(lse=poisoned(2, 4, 33, dtype=torch.float32, strides=(4 * 40, 40, 1))),
     ["lse must be contiguous"]),
    ("out wrong shape", lambda a: a.update(out=poisoned(2, 34, 4, a["q"].shape[-1], dtype=a["q"].dtype)),
     ["out must have q's shape"]),
    ("q not 16-byte aligned", lambda a: a.update(q=_misaligned(a["q"])), ["q: data pointer must be 16-byte aligned"]),
    ("k head stride odd", lambda a: a.update(k=_odd_head_stride(a["k"])), ["k: strides of every dim but the last must be multiples of 16 bytes"]),
    ("out heads overlap", lambda a: a.update(out=poisoned(*a["out"].shape, dtype=a["out"].dtype,
                                                           strides=(33 * a["q"].shape[-1], a["q"].shape[-1], 0, 1))),
     ["invalid argument"]),
    ("v on another shape", lambda a: a.update(v=a["v"][:, :64]), ["k and v must have the same shape"]),
    ("softcap negative", lambda a: a.update(options=dict(softcap=-1.0)), ["softcap must be a finite number >= 0"]),
    ("alibi_slopes float64", lambda a: a.update(options=dict(alibi_slopes=torch.ones(4, dtype=torch.float64,
                                                                                      device="cuda"))),
     ["alibi_slopes must be float32"]),
    ("alibi_slopes of 3 heads", lambda a: a.update(options=dict(alibi_slopes=torch.ones(3, device="cuda"))),
     ["alibi_slopes must have shape (nheads,) or (batch, nheads)"]),
    ("dropout_p of 1", lambda a: a.update(options=dict(dropout_p=1.0, dropout_seed=_seed())),
     ["dropout_p must be in [0, 1)"]),
    ("dropout without a seed", lambda a: a.update(options=dict(dropout_p=0.1)),
     ["dropout_seed is required when dropout_p > 0"]),
    ("dropout_seed int32", lambda a: a.update(options=dict(dropout_p=0.1, dropout_seed=_seed().int())),
     ["dropout_seed must be an int64 array of shape (1,)"]),
    ("attn_probs too few rows", lambda a: a.update(options=dict(
        dropout_p=0.1, dropout_seed=_seed(), attn_probs=poisoned(2, 4, 32, 128, dtype=a["q"].dtype))),
     ["attn_probs must have shape"]),
    ("attn_probs float32", lambda a: a.update(options=dict(
        dropout_p=0.1, dropout_seed=_seed(), attn_probs=poisoned(2, 4, 128, 128, dtype=torch.float32))),
     ["attn_probs must be float16 or bfloat16"]),
    ("attn_probs not contiguous", lambda a: a.update(options=dict(
        dropout_p=0.1, dropout_seed=_seed(),
        attn_probs=poisoned(2, 4, 128, 128, dtype=a["q"].dtype).transpose(2, 3))),
     ["attn_probs must be contiguous"]),
]

BWD_REFUSALS = [
    ("dq float32", lambda a: a.update(dq=poisoned(*a["dq"].shape, dtype=torch.float32)),
     ["dq must be float16 or bfloat16"]),
    ("dk of the other half dtype", lambda a: a.update(dk=poisoned(*a["dk"].shape, dtype=other_half(a["q"]))),
     ["dk must have q's dtype"]),
    ("dk wrong shape", lambda a: a.update(dk=poisoned(2, 64, 2, a["q"].shape[-1], dtype=a["q"].dtype)),
     ["k, v, dk and dv must have the same shape"]),
    ("workspace too small", lambda a: a.update(workspace=a["workspace"][:64]), ["workspace is smaller"]),
    ("workspace 2-D", lambda a: a.update(workspace=a["workspace"].view(2, -1)), ["workspace must be a contiguous 1-D"]),
    ("lse wrong shape", lambda a: a.update(lse=a["lse"].transpose(1, 2).contiguous()), ["lse must have shape"]),
    ("dout not 16-byte aligned", lambda a: a.update(dout=_misaligned(a["dout"])),
     ["dout: data pointer must be 16-byte aligned"]),
    ("dv rows overlap", lambda a: a.update(dv=poisoned(*a["dv"].shape, dtype=a["dv"].dtype,
                                                        strides=(65 * 2 * a["q"].shape[-1], 0, a["q"].shape[-1], 1))),
     ["invalid argument"]),
    ("softcap NaN", lambda a: a.update(options=dict(softcap=float("nan"))), ["softcap must be a finite number >= 0"]),
    ("alibi_slopes of another batch", lambda a: a.update(options=dict(alibi_slopes=torch.ones(3, 4, device="cuda"))),
     ["alibi_slopes must have shape (nheads,) or (batch, nheads)"]),
    ("dropout without a seed", lambda a: a.update(options=dict(dropout_p=0.1)),
     ["dropout_seed is required when dropout_p > 0"]),
    ("dropout_seed of 2 entries", lambda a: a.update(options=dict(dropout_p=0.1, dropout_seed=_seed().repeat(2))),
     ["dropout_seed must be an int64 array of shape (1,)"]),
]


def assert_refused_untouched(call, args, outputs, fragments):
    """call(args) raises ValueError naming `fragments`, and the caller's
    `outputs` (names in args) hold the same bits as before."""
    before = {n: args[n].clone() for n in outputs}
    torch.cuda.synchronize()
    with pytest.raises(ValueError) as info:
        call(args)
    torch.cuda.synchronize()
    for fragment in fragments:
        assert fragment in str(info.value), f"{fragment!r} not in {str(info.value)!r}"
    for n, t in before.items():
        assert torch.equal(args[n], t), f"{n} was written although the call was refused"


@pytest.mark.parametrize("row", FWD_REFUSALS, ids=[r[0] for r in FWD_REFUSALS])
def test_fwd_entry_point_refusal_leaves_outputs_untouched(row):
    _name, spoil, fragments = row
    a = fwd_args(*default_config())
    spoil(a)
    assert_refused_untouched(call_fwd, a, ("out", "lse"), fragments)


@pytest.mark.parametrize("row", BWD_REFUSALS, ids=[r[0] for r in BWD_REFUSALS])
def test_bwd_entry_point_refusal_leaves_outputs_untouched(row):
    _name, spoil, fragments = row
    a = bwd_args(*default_config())
    spoil(a)
    assert_refused_untouched(call_bwd, a, ("dq", "dk", "dv", "workspace"), fragments)


def test_unsupported_head_dim_through_the_entry_point():
    _, dtype = default_config()
    a = fwd_args(64, dtype)
    for n in ("q", "k", "v"):
        a[n] = torch.randn(*a[n].shape[:-1], 80, device="cuda", dtype=dtype)
    a["out"] = poisoned(2, 33, 4, 80, dtype=dtype)
    assert_refused_untouched(call_fwd, a, ("out", "lse"), ["unsupported head dim"])


# --------------------------------------------------------------------------
# NaN and inf in, as the reference does
# --------------------------------------------------------------------------


def nan_masks_match(got, ref, name):
    got_nan, ref_nan = torch.isnan(got), torch.isnan(ref)
    assert torch.equal(got_nan, ref_nan), (
        f"{name}: NaN at {int(got_nan.sum())} places, the reference at {int(ref_nan.sum())}; "
        f"{int((got_nan != ref_nan).sum())} differ")
    for sign, test in (("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        assert torch.equal(test(got), test(ref)), f"{name}: {sign} where the reference is not, or not where it is"


@pytest.mark.parametrize("where", ["q", "k", "v", "q_inf"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_nan_and_inf_inputs_propagate_like_the_reference(where, causal):
    """One row of q, k or v set to NaN (or q's to +inf): out and lse are NaN
    exactly where the float32 reference's are. A NaN in v also reaches the
    rows that mask it out in the dense reference (0 · NaN), which no
    block-skipping kernel reproduces, so v is tested without causal."""
    if where == "v" and causal:
        pytest.skip("the dense reference's 0 · NaN on masked positions is not a semantic")
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 200, 300, 4, 2, head_dim, dtype, requires_grad=False)
    if where == "q":
        q[1, 150, 2] = float("nan")
    elif where == "q_inf":
        q[0, 17, 1, 0] = float("inf")  # one element: scores of +inf and -inf in one row
    elif where == "k":
        k[1, 260, 1] = float("nan")
    else:
        v[0, 5, 0] = float("nan")
    out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    ref_out, ref_lse = attention_ref(q, k, v, causal=causal)
    assert torch.isnan(ref_out).any(), "the case must poison some output"
    nan_masks_match(out, ref_out, "out")
    nan_masks_match(lse, ref_lse, "lse")  # a NaN in v leaves lse finite


def test_lse_of_a_row_with_an_infinite_score():
    """The row's max is +inf: its logsumexp is +inf, as the reference's (once
    NaN, from m + log(l) with l = NaN)."""
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 200, 300, 4, 2, head_dim, dtype, requires_grad=False)
    q[0, 17, 1, 0] = float("inf")
    _, lse, _ = flashtile.flash_attn_func(q, k, v, return_attn_probs=True)
    _, ref_lse = attention_ref(q, k, v)
    assert torch.isposinf(ref_lse[0, 1, 17])
    assert torch.isposinf(lse[0, 1, 17]), f"lse {lse[0, 1, 17].item()} where the reference's is +inf"


@pytest.mark.parametrize("poison", ["nan", "inf"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_nan_or_inf_in_q_propagates_through_the_backward_like_the_reference(deterministic, poison):
    """A NaN in q, or one +inf element (a row of +inf and −inf scores, whose
    probabilities the reference makes NaN at the +inf scores and 0 at the
    others): dq, dk, dv are NaN exactly where the reference's are."""
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 200, 300, 4, 2, head_dim, dtype, requires_grad=False)
    if poison == "nan":
        q[1, 150, 2] = float("nan")
    else:
        q[1, 150, 2, 0] = float("inf")
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    out = flashtile.flash_attn_func(q, k, v, deterministic=deterministic)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    _, ref_grads = attention_ref_backward(q, k, v, dout)
    for name, got, ref in zip(("dq", "dk", "dv"), grads, ref_grads):
        nan_masks_match(got, ref, name)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_scores_of_1e4_stay_finite(causal):
    """q·k up to ±1e4 before the softmax scale (the fp32 reference is finite
    there): outputs, lse and gradients finite and within the rule."""
    require_built(128, torch.bfloat16)
    q, k, v = rand_qkv(2, 257, 321, 4, 2, 128, torch.bfloat16, requires_grad=False)
    q, k = q * 15, k * 15
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.repeat_interleave(2, dim=2).float())
    assert scores.abs().max().item() > 5e3, "the case must reach scores of thousands"
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    out, grads = run_and_check(q, k, v, causal)
    for name, t in (("out", out), *zip(("dq", "dk", "dv"), grads)):
        assert torch.isfinite(t).all(), f"{name} has NaN or inf"


# --------------------------------------------------------------------------
# CUDA graphs and torch.compile
# --------------------------------------------------------------------------


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_cuda_graph_replays_forward_and_backward_with_new_inputs(deterministic):
    head_dim, dtype = default_config()
    shapes = dict(batch=2, seqlen_q=257, seqlen_k=300, nheads=4, nheads_k=2, head_dim=head_dim, dtype=dtype)
    static = rand_qkv(*shapes.values())
    static_dout = torch.randn(2, 257, 4, head_dim, device="cuda", dtype=dtype)

    def step():
        out = flashtile.flash_attn_func(*static, causal=True, deterministic=deterministic)
        return (out, *torch.autograd.grad(out, static, static_dout))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch's docs ask
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()

    for _ in range(2):
        fresh = rand_qkv(*shapes.values())
        fresh_dout = torch.randn_like(static_dout)
        with torch.no_grad():
            for s, f in zip(static, fresh):
                s.copy_(f)
            static_dout.copy_(fresh_dout)
        graph.replay()
        torch.cuda.synchronize()
        out = flashtile.flash_attn_func(*fresh, causal=True, deterministic=deterministic)
        eager = (out, *torch.autograd.grad(out, fresh, fresh_dout))
        assert torch.equal(captured[0], eager[0]), "replayed out differs from eager"
        for name, got, want in zip(("dq", "dk", "dv"), captured[1:], eager[1:]):
            if name == "dq" and not deterministic:  # fp32 atomic adds: order varies
                assert_close_up_to_atomics(got, want, name)
            else:  # dk, dv (registers) and deterministic dq repeat bit for bit
                assert torch.equal(got, want), f"replayed {name} differs from eager"
        check_grads(*fresh, fresh_dout, captured[0], captured[1:], causal=True)


class AttentionBlock(torch.nn.Module):
    """Pre-norm self-attention: norm, qkv projection, flashtile, output projection."""

    def __init__(self, dim, nheads):
        super().__init__()
        self.nheads = nheads
        self.norm = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        batch, seqlen, dim = x.shape
        qkv = self.qkv(self.norm(x)).view(batch, seqlen, 3, self.nheads, dim // self.nheads)
        out = flashtile.flash_attn_qkvpacked_func(qkv, causal=True)
        return x + self.proj(out.reshape(batch, seqlen, dim))


@pytest.mark.parametrize("padded", [False, True], ids=["kernel_head_dim", "padded_head_dim"])
def test_torch_compile_fullgraph_of_an_attention_block(padded):
    head_dim, dtype = default_config()
    if padded:  # 40 runs the head-dim-64 kernel on zero-padded q, k, v
        require_built(64, dtype)
        head_dim = 40
    torch.manual_seed(0)
    block = AttentionBlock(4 * head_dim, 4).to(device="cuda", dtype=dtype)
    x = torch.randn(2, 129, 4 * head_dim, device="cuda", dtype=dtype, requires_grad=True)
    compiled = torch.compile(block, fullgraph=True)  # a graph break raises

    def run(module):
        y = module(x)
        grads = torch.autograd.grad(y.float().square().mean(), (x, *block.parameters()))
        return y, grads

    y_eager, g_eager = run(block)
    y_compiled, g_compiled = run(compiled)
    # Same kernels for the attention; inductor may fuse the rest differently,
    # so compare at bf16/fp16 resolution.
    torch.testing.assert_close(y_compiled, y_eager, rtol=2e-2, atol=2e-2)
    for i, (got, want) in enumerate(zip(g_compiled, g_eager)):
        torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2 * want.abs().max().item(),
                                   msg=lambda m: f"gradient {i}: {m}")


# --------------------------------------------------------------------------
# streams and devices
# --------------------------------------------------------------------------


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_backward_runs_on_the_current_stream(deterministic):
    """Forward and backward on a side stream whose inputs land behind a sleep;
    only that stream is synchronized, so work launched on any other stream
    would read the NaN the inputs start as."""
    head_dim, dtype = default_config()
    src = rand_qkv(2, 301, 415, 4, 2, head_dim, dtype, requires_grad=False)
    src_dout = torch.randn(2, 301, 4, head_dim, device="cuda", dtype=dtype)
    q, k, v = (torch.full_like(t, float("nan")) for t in src)
    dout = torch.full_like(src_dout, float("nan"))
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        for dst, s in zip((q, k, v, dout), (*src, src_dout)):
            dst.copy_(s)
        leaves = tuple(t.requires_grad_() for t in (q, k, v))
        out = flashtile.flash_attn_func(*leaves, causal=True, deterministic=deterministic)
        grads = torch.autograd.grad(out, leaves, dout)
    side.synchronize()
    check_grads(*(s.detach() for s in src), src_dout, out, grads, causal=True)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_backward_runs_on_the_tensors_device(deterministic):
    """Tensors on cuda:1 while cuda:0 is current: every kernel, allocation
    and stream is cuda:1's."""
    head_dim, dtype = default_config()
    with torch.cuda.device(1):
        q, k, v = rand_qkv(2, 129, 257, 4, 2, head_dim, dtype)
        dout = torch.randn_like(q)
    with torch.cuda.device(0):
        out = flashtile.flash_attn_func(q, k, v, causal=True, deterministic=deterministic)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    assert out.device == q.device and all(g.device == q.device for g in grads)
    check_grads(q, k, v, dout, out, grads, causal=True)


# --------------------------------------------------------------------------
# shapes: empty, broadcast, past 2^31 elements, past 65535 heads × batch
# --------------------------------------------------------------------------


@pytest.mark.parametrize("batch, seqlen_q, seqlen_k, nheads",
                         [(0, 17, 33, 4), (2, 0, 33, 4), (2, 17, 0, 4), (2, 17, 33, 0)])
def test_empty_inputs_give_defined_results_and_zero_grads(batch, seqlen_q, seqlen_k, nheads):
    head_dim, dtype = default_config()
    q = torch.randn(batch, seqlen_q, nheads, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(batch, seqlen_k, 2, head_dim, device="cuda", dtype=dtype, requires_grad=True)
            for _ in range(2))
    out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (batch, nheads, seqlen_q)
    if seqlen_k == 0:
        assert (out == 0).all() and torch.isneginf(lse).all()
    grads = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    for name, g, like in zip(("dq", "dk", "dv"), grads, (q, k, v)):
        assert g.shape == like.shape and (g == 0).all(), f"{name} must be zeros of {tuple(like.shape)}"
    torch.cuda.synchronize()


@pytest.mark.parametrize("dim", [0, 2], ids=["over_batch", "over_heads"])
def test_broadcast_kv_with_stride_zero(dim):
    """k and v expanded over the batch or over their heads (stride 0) are
    valid inputs: read, not written; their gradient sums over that dim
    through autograd. (Expanded over heads, the forward runs them as one KV
    head: flashtile.hpp's with_broadcast_kv_as_one_head.)"""
    head_dim, dtype = default_config()
    q = torch.randn(3, 130, 4, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    shape = [3, 190, 2, head_dim]
    shape[dim] = 1
    k1, v1 = (torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    k, v = k1.expand(3, -1, 2, -1), v1.expand(3, -1, 2, -1)
    assert k.stride(dim) == 0 and v.stride(dim) == 0
    out = flashtile.flash_attn_func(q, k, v, causal=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k1, v1), dout)
    ref_out, (ref_dq, ref_dk, ref_dv) = attention_ref_backward(q, k.contiguous(), v.contiguous(), dout, True)
    pt_out, (pt_dq, pt_dk, pt_dv) = attention_ref_backward(q, k.contiguous(), v.contiguous(), dout, True,
                                                           upcast=False)
    assert_close_fa_rule(out, ref_out, pt_out, "out")
    assert_close_fa_rule(grads[0], ref_dq, pt_dq, "dq")
    assert_close_fa_rule(grads[1], ref_dk.sum(dim, keepdim=True), pt_dk.float().sum(dim, keepdim=True), "dk", atol=1e-4)
    assert_close_fa_rule(grads[2], ref_dv.sum(dim, keepdim=True), pt_dv.float().sum(dim, keepdim=True), "dv", atol=1e-4)


def spot_check_heads(q, k, v, dout, out, lse, grads, picks, causal):
    """(batch, head) slices of a big problem against the reference on those slices."""
    group = q.shape[2] // k.shape[2]
    for b, h in picks:
        hk = h // group
        sl = lambda t, head: t[b:b + 1, :, head:head + 1]
        qs, ks, vs, dos = sl(q, h), sl(k, hk), sl(v, hk), sl(dout, h)
        ref_out, ref_grads = attention_ref_backward(qs, ks, vs, dos, causal)
        pt_out, pt_grads = attention_ref_backward(qs, ks, vs, dos, causal, upcast=False)
        where = f"(batch {b}, head {h})"
        assert_close_fa_rule(sl(out, h), ref_out, pt_out, f"out {where}")
        _, ref_lse = attention_ref(qs, ks, vs, causal=causal)
        _, pt_lse = attention_ref(qs, ks, vs, causal=causal, upcast=False)
        assert_close_fa_rule(lse[b:b + 1, h:h + 1], ref_lse, pt_lse, f"lse {where}")
        dq, dk, dv = grads
        assert_close_fa_rule(sl(dq, h), ref_grads[0], pt_grads[0], f"dq {where}")
        if group == 1:
            assert_close_fa_rule(sl(dk, hk), ref_grads[1], pt_grads[1], f"dk {where}")
            assert_close_fa_rule(sl(dv, hk), ref_grads[2], pt_grads[2], f"dv {where}")


def test_more_than_2_31_elements_across_the_batch():
    """q, k, v, dout of 1040 × 128 × 128 × 128 = 2.18e9 elements each (4.4 GB):
    batch offsets past 2^31 elements; batch × heads = 133,120 CTAs' worth."""
    require_built(128, torch.bfloat16)
    shape = (1040, 128, 128, 128)
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    assert q.numel() > 2**31
    leaves = tuple(t.requires_grad_() for t in (q, k, v))
    out, lse, _ = flashtile.flash_attn_func(*leaves, causal=True, return_attn_probs=True)
    grads = torch.autograd.grad(out, leaves, dout)
    spot_check_heads(q.detach(), k.detach(), v.detach(), dout, out, lse, grads,
                     [(0, 0), (777, 64), (1039, 127)], causal=True)


def test_more_than_2_31_elements_in_one_sequence():
    """One sequence of 65,600 rows × 512 heads × 64 = 2.15e9 elements per
    query-shaped tensor: row offsets inside a batch past 2^31 elements, GQA 4.
    Rows are independent in out and dq, so the first and the last 256 query
    rows of the first and last heads are checked against the reference run on
    those rows alone (bottom-right causal alignment keeps each row's keys)."""
    require_built(64, torch.bfloat16)
    seqlen, rows = 65600, 256
    q = torch.randn(1, seqlen, 512, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, seqlen, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn_like(q)
    assert q.numel() > 2**31
    leaves = tuple(t.requires_grad_() for t in (q, k, v))
    out, lse, _ = flashtile.flash_attn_func(*leaves, causal=True, return_attn_probs=True)
    dq = torch.autograd.grad(out, leaves, dout)[0]
    q, k, v = (t.detach() for t in leaves)
    del leaves
    for head in (0, 511):
        hk = head // 4
        for first, keys in ((0, rows), (seqlen - rows, seqlen)):
            sel = slice(first, first + rows)
            qs, dos = q[:, sel, head:head + 1], dout[:, sel, head:head + 1]
            ks, vs = k[:, :keys, hk:hk + 1], v[:, :keys, hk:hk + 1]
            ref_out, (ref_dq, _, _) = attention_ref_backward(qs, ks, vs, dos, True)
            pt_out, (pt_dq, _, _) = attention_ref_backward(qs, ks, vs, dos, True, upcast=False)
            _, ref_lse = attention_ref(qs, ks, vs, causal=True)
            _, pt_lse = attention_ref(qs, ks, vs, causal=True, upcast=False)
            where = f"(head {head}, rows {first}..{first + rows - 1})"
            assert_close_fa_rule(out[:, sel, head:head + 1], ref_out, pt_out, f"out {where}")
            assert_close_fa_rule(lse[:, head:head + 1, sel], ref_lse, pt_lse, f"lse {where}")
            assert_close_fa_rule(dq[:, sel, head:head + 1], ref_dq, pt_dq, f"dq {where}")
