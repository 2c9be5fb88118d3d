"""Variable-length batches (flash_attn_varlen_func and its packed forms),
forward and backward, against the float32 reference run on each sequence
alone, with FlashAttention's error rule: lengths from 0 to several blocks,
seqlen_q above, equal to and below seqlen_k per sequence, causal, windows,
softcap and ALiBi, GQA, seqused_k, every kernel head dim, fp16 and bf16, the
deterministic backward, and strided (non-contiguous) packed tensors."""

import contextlib

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import flashtile
from flashtile import _C, _checks
from kernel_names import cuda_kernel_names, fwd_tile_of, require_short_fwd_tile, sm80_kernels_only
from reference import assert_close_fa_rule, attention_ref, attention_ref_backward

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
BUILT = {(int(d), str(n), str(variant)) for direction, _arch, d, n, variant in _C.built_kernels()
         if direction == "bwd"}
GRAD_ATOL = 1e-4  # as test_window_gpu.py: rows with one visible key


def require_built(head_dim, dtype_name, variant="plain"):
    if (head_dim, dtype_name, variant) not in BUILT:
        pytest.skip(f"hdim{head_dim}/{dtype_name}/{variant} is not in this build")


def offsets(lengths, start=0):
    return torch.tensor([start] + [start + n for n in torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                        device="cuda")


def packed(lengths, nheads, head_dim, dtype, lead=0, tail=0):
    """A (lead + total + tail, nheads, head_dim) leaf tensor whose rows lead .. lead + total hold the sequences."""
    return torch.randn(lead + sum(lengths) + tail, nheads, head_dim, device="cuda", dtype=dtype).requires_grad_()


def reference(q, k, v, dout, lens_q, lens_k, used_k=None, upcast=True, **opts):
    """Per-sequence reference: (out, lse, dq, dk, dv) in the packed layouts
    (lse (nheads, total_q)); keys past used_k get zero dk, dv."""
    outs, lses, dqs, dks, dvs = [], [], [], [], []
    cq = ck = 0
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        uk = lk if used_k is None else used_k[b]
        qs, ks, vs, ds = q[cq:cq + lq], k[ck:ck + uk], v[ck:ck + uk], dout[cq:cq + lq]
        seq_opts = dict(opts)
        if opts.get("alibi_slopes") is not None and opts["alibi_slopes"].dim() == 2:
            seq_opts["alibi_slopes"] = opts["alibi_slopes"][b]
        if lq == 0 or uk == 0:  # nothing attended: out 0, lse -inf, zero gradients
            dtype = torch.float32 if upcast else q.dtype
            out = torch.zeros(1, lq, *q.shape[1:], dtype=dtype, device=q.device)
            lse = torch.full((1, q.shape[1], lq), float("-inf"), dtype=dtype, device=q.device)
            dq = out.clone()
            dk = torch.zeros(1, uk, *k.shape[1:], dtype=dtype, device=k.device)
            dv = dk.clone()
        else:
            out, lse = attention_ref(qs[None].detach(), ks[None].detach(), vs[None].detach(), upcast=upcast,
                                     **seq_opts)
            _, (dq, dk, dv) = attention_ref_backward(qs[None], ks[None], vs[None], ds[None], upcast=upcast,
                                                     **seq_opts)
        pad = torch.zeros(lk - uk, *k.shape[1:], dtype=dk.dtype, device=k.device)
        outs.append(out[0]), lses.append(lse[0]), dqs.append(dq[0])
        dks.append(torch.cat([dk[0], pad])), dvs.append(torch.cat([dv[0], pad]))
        cq, ck = cq + lq, ck + lk
    return torch.cat(outs), torch.cat(lses, dim=1), torch.cat(dqs), torch.cat(dks), torch.cat(dvs)


def check_varlen(lens_q, lens_k, nheads=4, nheads_k=2, head_dim=128, dtype=torch.bfloat16, seqused_k=None,
                 deterministic=False, lead=0, tail=0, max_slack=0, **opts):
    """flashtile's out, lse, dq, dk, dv on the packed batch against the per-sequence reference.
    lead and tail: rows before and after the sequences (outside every one, so
    left unwritten and not compared); max_slack: added to max_seqlen_q/k."""
    q = packed(lens_q, nheads, head_dim, dtype, lead, tail)
    k, v = (packed(lens_k, nheads_k, head_dim, dtype, lead, tail) for _ in range(2))
    cu_q, cu_k = offsets(lens_q, lead), offsets(lens_k, lead)
    used = None if seqused_k is None else torch.tensor(seqused_k, dtype=torch.int32, device="cuda")
    out, lse, _ = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q) + max_slack,
                                                   max(lens_k) + max_slack, deterministic=deterministic,
                                                   return_attn_probs=True, seqused_k=used, **opts)
    assert out.shape == q.shape and lse.shape == (nheads, q.shape[0])
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    rows_q, rows_k = slice(lead, lead + sum(lens_q)), slice(lead, lead + sum(lens_k))
    inner = [t[rows] for t, rows in ((q, rows_q), (k, rows_k), (v, rows_k), (dout, rows_q))]
    ref = reference(*inner, lens_q, lens_k, seqused_k, **opts)
    pt = reference(*inner, lens_q, lens_k, seqused_k, upcast=False, **opts)
    out, lse = out[rows_q], lse[:, rows_q]
    grads = (grads[0][rows_q], grads[1][rows_k], grads[2][rows_k])
    for name, got, r, p in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads), ref, pt):
        if name in ("dq", "dk", "dv"):
            assert torch.isfinite(got).all(), f"{name} is not finite"
        assert_close_fa_rule(got, r, p, name, atol=GRAD_ATOL if name.startswith("d") else 1e-5)
    return out, lse, grads


# Lengths with an empty sequence, single rows, block edges and several blocks.
LENS = {
    "mixed": ([130, 0, 1, 257, 64], [130, 5, 0, 300, 1]),
    "q-longer": ([300, 77, 129], [40, 77, 128]),
    "equal": ([128, 200, 1, 513], [128, 200, 1, 513]),
}


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("mask", ["full", "causal", "window"])
@pytest.mark.parametrize("lens", list(LENS))
def test_varlen(lens, mask, deterministic):
    require_built(128, "bf16")
    causal = mask == "causal"
    window = (33, 7) if mask == "window" else (-1, -1)
    check_varlen(*LENS[lens], causal=causal, window_size=window, deterministic=deterministic)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", list(_checks.SUPPORTED_HEAD_DIMS))
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_varlen_every_head_dim_and_dtype(dtype_name, head_dim, causal):
    require_built(head_dim, dtype_name)
    check_varlen([190, 0, 333, 65], [250, 17, 333, 1], nheads=6, nheads_k=3, head_dim=head_dim,
                 dtype=DTYPES[dtype_name], causal=causal)


@pytest.mark.parametrize("lens_k, tile", [([2100, 1, 300], (128, 64)), ([2000, 1, 300], (128, 128))],
                         ids=["past-2048", "within-2048"])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_varlen_d64_key_tile_switch(dtype_name, lens_k, tile):
    """d64 without a mask switches tiles at 2048 keys (FwdShortConfig) on
    max_seqlen_k: every sequence of a batch runs its longest one's tile, on
    both sides of the switch, and matches the reference."""
    require_short_fwd_tile()
    require_built(64, dtype_name)
    with sm80_kernels_only():
        _, names = cuda_kernel_names(lambda: check_varlen([70, 0, 129], lens_k, nheads=4, nheads_k=2, head_dim=64,
                                                          dtype=DTYPES[dtype_name]))
    assert fwd_tile_of(names) == tile


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [128, 192])  # 192: the wgmma backward's own early exit on sm90
def test_varlen_seqused_k(head_dim, causal):
    """Sequence b attends to its first seqused_k[b] keys only; the rest get zero dk, dv."""
    require_built(head_dim, "bf16")
    _, _, (_, dk, dv) = check_varlen([100, 200, 64], [150, 300, 80], seqused_k=[150, 37, 0], causal=causal,
                                     head_dim=head_dim)
    assert (dk[150 + 37:450] == 0).all() and (dv[450:] == 0).all()


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_varlen_softcap_and_alibi(dtype_name):
    require_built(64, dtype_name, "scoremod")
    slopes = torch.rand(3, 4, device="cuda") * 0.3
    check_varlen([150, 1, 260], [200, 33, 260], head_dim=64, dtype=DTYPES[dtype_name], causal=True,
                 softcap=6.0, alibi_slopes=slopes)


def test_varlen_matches_the_fixed_length_batch():
    """Equal lengths: the varlen call gives the fixed-length call's out and lse bit for bit."""
    require_built(128, "bf16")
    q, k, v = (torch.randn(3, 257, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    cu = offsets([257] * 3)
    out_vl, lse_vl, _ = flashtile.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu,
                                                         257, 257, causal=True, return_attn_probs=True)
    assert torch.equal(out_vl, out.flatten(0, 1))
    assert torch.equal(lse_vl, lse.transpose(0, 1).flatten(1, 2))


def test_varlen_packed_functions_and_strided_inputs():
    """qkvpacked and kvpacked views (strided, not contiguous) give what separate contiguous tensors give."""
    require_built(64, "fp16")
    lens = [70, 0, 190]
    qkv = torch.randn(sum(lens), 3, 4, 64, device="cuda", dtype=torch.float16)
    cu = offsets(lens)
    expect = flashtile.flash_attn_varlen_func(*(t.contiguous() for t in qkv.unbind(1)), cu, cu, 190, 190, causal=True)
    assert torch.equal(flashtile.flash_attn_varlen_qkvpacked_func(qkv, cu, 190, causal=True), expect)
    q = qkv[:, 0]
    assert torch.equal(flashtile.flash_attn_varlen_kvpacked_func(q, qkv[:, 1:], cu, cu, 190, 190, causal=True), expect)


def test_varlen_padded_head_dim():
    require_built(96, "bf16")
    check_varlen([100, 3, 150], [120, 3, 90], head_dim=72, causal=True)


def test_varlen_rows_outside_the_sequences_and_loose_maxima():
    """cu_seqlens starting past row 0, rows after the last sequence, and
    max_seqlen_q/k above every length: the sequences' results are unchanged."""
    require_built(128, "bf16")
    check_varlen([130, 7, 64], [90, 300, 1], lead=37, tail=50, max_slack=200, causal=True)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_varlen_seqused_k_with_alibi_window(deterministic):
    """seqused_k with ALiBi and a window: both align to the used keys' corner."""
    require_built(64, "bf16", "scoremod")
    slopes = torch.rand(3, 4, device="cuda") * 0.2
    check_varlen([100, 200, 64], [150, 300, 80], seqused_k=[150, 137, 5], head_dim=64, window_size=(40, 9),
                 alibi_slopes=slopes, deterministic=deterministic)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_varlen_in_a_cuda_graph(deterministic):
    """The varlen path never reads the offsets on the host, so forward and
    backward capture into a CUDA graph; replays with new values (offsets
    included) give what eager calls give."""
    require_built(128, "bf16")
    lens = [100, 0, 257]
    static = [packed(lens, 4, 128, torch.bfloat16) for _ in range(3)]
    static_dout = torch.randn_like(static[0])
    static_cu = offsets(lens)

    def step(q, k, v, cu, dout):
        out = flashtile.flash_attn_varlen_func(q, k, v, cu, cu, 257, 257, causal=True, deterministic=deterministic)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch's docs ask
        for _ in range(2):
            step(*static, static_cu, static_dout)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(*static, static_cu, static_dout)

    for new_lens in ([120, 37, 200], [1, 256, 100]):  # same total rows, other boundaries
        fresh = [torch.randn_like(t) for t in static]
        fresh_dout = torch.randn_like(static_dout)
        with torch.no_grad():
            for s, f in zip(static, fresh):
                s.copy_(f)
            static_dout.copy_(fresh_dout)
            static_cu.copy_(offsets(new_lens))
        graph.replay()
        leaves = [f.detach().requires_grad_() for f in fresh]
        expected = step(*leaves, offsets(new_lens), fresh_dout)
        for name, got, want in zip(("out", "dq", "dk", "dv"), captured, expected):
            if deterministic or name in ("out", "dk", "dv"):
                assert torch.equal(got, want), f"{name} of the replay differs from eager"
            else:  # dq's atomic adds sum in a varying order
                torch.testing.assert_close(got, want, rtol=0, atol=2e-2, msg=lambda m: f"{name}: {m}")


def test_varlen_under_torch_compile_fullgraph():
    """flash_attn_varlen_func traces without a graph break; the compiled
    forward and backward match eager."""
    require_built(64, "fp16")
    lens = [70, 0, 190, 33]
    q, k, v = (packed(lens, 4, 64, torch.float16) for _ in range(3))
    cu = offsets(lens)

    def attention(q, k, v, cu):
        return flashtile.flash_attn_varlen_func(q, k, v, cu, cu, 190, 190, causal=True, deterministic=True)

    compiled = torch.compile(attention, fullgraph=True)  # a graph break raises
    dout = torch.randn_like(q)
    out_eager = attention(q, k, v, cu)
    grads_eager = torch.autograd.grad(out_eager, (q, k, v), dout)
    out_compiled = compiled(q, k, v, cu)
    grads_compiled = torch.autograd.grad(out_compiled, (q, k, v), dout)
    assert torch.equal(out_compiled, out_eager)
    for name, got, want in zip(("dq", "dk", "dv"), grads_compiled, grads_eager):
        assert torch.equal(got, want), f"{name} differs under torch.compile"


def dispatch(path):
    """The kernels a test runs: every path the dispatch may take ("any") or
    the sm80 ones alone."""
    return sm80_kernels_only() if path == "sm80" else contextlib.nullcontext()


@pytest.mark.parametrize("path", ["any", "sm80"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_keys_past_seqused_k_never_reach_the_output(causal, path):
    """A KV cache's slots past seqused_k may hold anything, NaN and Inf
    included: their probabilities are 0, and no kernel may let 0 · NaN into
    out or lse (the sm80 kernels zero-fill those rows, the sm90 forward
    clears them in shared memory)."""
    require_built(128, "bf16")
    lens_q, lens_k, used = [70, 1, 129], [300, 150, 260], [37, 150, 200]
    q = packed(lens_q, 4, 128, torch.bfloat16, 0, 0)
    k, v = (packed(lens_k, 2, 128, torch.bfloat16, 0, 0) for _ in range(2))
    cu_q, cu_k = offsets(lens_q, 0), offsets(lens_k, 0)
    with torch.no_grad():
        for b, (start, n_used) in enumerate(zip(cu_k[:-1].tolist(), used)):
            k[start + n_used:cu_k[b + 1]] = float("nan")
            v[start + n_used:cu_k[b + 1]] = float("inf") if b % 2 else float("nan")
    used_t = torch.tensor(used, dtype=torch.int32, device="cuda")
    with dispatch(path):
        out, lse, _ = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                       causal=causal, return_attn_probs=True, seqused_k=used_t)
    # Causal rows before a sequence's first used key see none: out 0, lse -inf.
    assert torch.isfinite(out).all() and not (torch.isnan(lse) | (lse == float("inf"))).any()
    for b in range(len(lens_q)):
        q0, q1, k0 = cu_q[b].item(), cu_q[b + 1].item(), cu_k[b].item()
        ref, _ = attention_ref(q[None, q0:q1], k[None, k0:k0 + used[b]], v[None, k0:k0 + used[b]], causal=causal)
        pt, _ = attention_ref(q[None, q0:q1], k[None, k0:k0 + used[b]], v[None, k0:k0 + used[b]], causal=causal,
                              upcast=False)
        assert_close_fa_rule(out[None, q0:q1], ref, pt, f"out of sequence {b}")


@pytest.mark.parametrize("path", ["any", "sm80"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_varlen_nan_stays_in_its_sequence(head_dim, path):
    """As flash_attn: an Inf or NaN in one sequence's keys or values makes
    that sequence's output NaN and leaves its neighbours' alone, though a
    key block straddling two sequences is loaded whole. Sequence 1 is all
    NaN in K and Inf in V; sequences 0 and 2 end mid-block."""
    require_built(head_dim, "bf16")
    lens_q, lens_k = [70, 33, 129], [300, 150, 197]
    q = packed(lens_q, 4, head_dim, torch.bfloat16)
    k, v = (packed(lens_k, 2, head_dim, torch.bfloat16) for _ in range(2))
    cu_q, cu_k = offsets(lens_q), offsets(lens_k)
    with torch.no_grad():
        k[cu_k[1]:cu_k[2]] = float("nan")
        v[cu_k[1]:cu_k[2]] = float("inf")
    with dispatch(path):
        out = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k))
    assert torch.isnan(out[cu_q[1]:cu_q[2]]).all(), "sequence 1 attends its own NaN keys"
    for b in (0, 2):
        q0, q1, k0, k1 = cu_q[b].item(), cu_q[b + 1].item(), cu_k[b].item(), cu_k[b + 1].item()
        ref, _ = attention_ref(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1])
        pt, _ = attention_ref(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], upcast=False)
        assert_close_fa_rule(out[None, q0:q1], ref, pt, f"out of sequence {b}")
