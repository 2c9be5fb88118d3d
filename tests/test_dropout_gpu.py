"""Dropout, forward and backward, against the float32 reference computed with
the kernels' own keep mask, under FlashAttention's error rule.

The mask is checked two ways: the testing-only probabilities
(return_attn_probs) carry it in their sign bits, and it must equal the one
tests/reference.py derives from the documented Philox scheme
(common/dropout.hpp) for the seed the call draws. Then: every head dim,
fp16 and bf16, no mask, causal and a window, seqlen_q above, equal to and
below seqlen_k, GQA, softcap and ALiBi, the deterministic backward,
variable-length batches, kept fractions within statistical bounds,
torch.manual_seed reproducing a call, CUDA graph replays and torch.compile.
On an H100/H200 the forward runs the wgmma kernels (and the separate
probabilities kernel for return_attn_probs; without it the mask is checked
against the documented one directly), the backward the sm80 ones.
"""

import math

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import flashtile
from flashtile.compat import flash_attn_interface as fai
from flashtile.interface import _dropout_seed
from kernel_names import cuda_kernel_names, require_sm90, sm90_built
from reference import (assert_close_fa_rule, attention_ref, attention_ref_backward, causal_mask,
                       dropout_keep_mask, dropout_keep_probability)
# Dropout runs the scoremod kernels: the same build check, inputs and slack.
from test_score_mod_gpu import DTYPES, GRAD_ATOL, rand_qkv, require_built


def seed_of_next_call(torch_seed):
    """Seeds torch with torch_seed and returns the Philox key that
    flashtile's next dropout call draws from the CUDA generator."""
    torch.manual_seed(torch_seed)
    key = int(_dropout_seed(torch.device("cuda")).item())
    torch.manual_seed(torch_seed)
    return key


def keep_mask(key, batch, nheads, seqlen_q, seqlen_k, dropout_p):
    """(batch, nheads, seqlen_q, seqlen_k) bool: the documented keep decisions."""
    return torch.stack([dropout_keep_mask(key, b, nheads, seqlen_q, seqlen_k, dropout_p, "cuda")
                        for b in range(batch)])


def kept_by_kernel(attn_probs, seqlen_q, seqlen_k):
    """The keep decisions carried by the probabilities' sign bits."""
    return ~torch.signbit(attn_probs[:, :, :seqlen_q, :seqlen_k])


def check_against_reference(q, k, v, dropout_p, keep, out, lse, **opts):
    """out, lse and the gradients against the reference with mask `keep`."""
    ref_opts = dict(opts, dropout_p=dropout_p, dropout_keep=keep)
    ref_out, ref_lse = attention_ref(q.detach(), k.detach(), v.detach(), **ref_opts)
    pt_out, pt_lse = attention_ref(q.detach(), k.detach(), v.detach(), upcast=False, **ref_opts)
    assert_close_fa_rule(out, ref_out, pt_out, "out")
    assert_close_fa_rule(lse, ref_lse, pt_lse, "lse")
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    _, ref_grads = attention_ref_backward(q, k, v, dout, **ref_opts)
    _, pt_grads = attention_ref_backward(q, k, v, dout, upcast=False, **ref_opts)
    for name, got, ref, pt in zip(("dq", "dk", "dv"), grads, ref_grads, pt_grads):
        assert_close_fa_rule(got, ref, pt, name, atol=GRAD_ATOL)
    return grads


def run_and_check(q, k, v, dropout_p, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                  deterministic=False):
    batch, seqlen_q, nheads, _ = q.shape
    seqlen_k = k.shape[1]
    key = seed_of_next_call(1234)
    out, lse, attn_probs = flashtile.flash_attn_func(
        q, k, v, dropout_p=dropout_p, causal=causal, window_size=window_size, softcap=softcap,
        alibi_slopes=alibi_slopes, deterministic=deterministic, return_attn_probs=True)
    assert attn_probs.shape == (batch, nheads, math.ceil(seqlen_q / 128) * 128, math.ceil(seqlen_k / 128) * 128)
    assert attn_probs.dtype == q.dtype
    keep = keep_mask(key, batch, nheads, seqlen_q, seqlen_k, dropout_p)
    assert torch.equal(kept_by_kernel(attn_probs, seqlen_q, seqlen_k), keep), "the kernels' mask is not the documented one"
    outside = torch.ones_like(attn_probs, dtype=torch.bool)
    outside[:, :, :seqlen_q, :seqlen_k] = False
    assert torch.all(attn_probs[outside] == 0) and not torch.signbit(attn_probs[outside]).any()
    check_against_reference(q, k, v, dropout_p, keep, out, lse, causal=causal, window_size=window_size,
                            softcap=softcap, alibi_slopes=alibi_slopes)
    return attn_probs


MASKS = {"none": dict(), "causal": dict(causal=True), "window": dict(window_size=(37, 5))}


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(128, 128), (113, 203), (237, 91)])
def test_dropout_against_the_reference_with_the_kernels_mask(dtype_name, mask, seqlen_q, seqlen_k):
    require_built(64, dtype_name)
    q, k, v = rand_qkv(2, seqlen_q, seqlen_k, 4, 2, 64, DTYPES[dtype_name])
    run_and_check(q, k, v, 0.17, **MASKS[mask])


def check_wgmma_forward_with_dropout(q, k, v, dropout_p, cu_seqlens=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None):
    """The forward through flash_attn's low-level entry (no S_dmask: the
    attention kernel's own mask) and the backward with its rng_state, against the
    reference with the documented keep mask of the seed in rng_state.
    q, k, v: (batch, seqlen, heads, d), or with cu_seqlens = (cu_q, cu_k)
    their rows packed, as flash_attn_varlen_func takes them."""
    q, k, v = (t.detach() for t in (q, k, v))
    scale = q.shape[-1] ** -0.5
    mask = dict(causal=causal, window_size_left=window_size[0], window_size_right=window_size[1],
                softcap=softcap, alibi_slopes=alibi_slopes)
    if cu_seqlens is None:
        sequences = [(b, slice(None), slice(None)) for b in range(q.shape[0])]
        run = lambda: fai._flash_attn_forward(q, k, v, dropout_p, scale, **mask)
    else:
        cu_q, cu_k = cu_seqlens
        sequences = [(b, slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1])))
                     for b in range(len(cu_q) - 1)]
        max_q, max_k = int((cu_q[1:] - cu_q[:-1]).max()), int((cu_k[1:] - cu_k[:-1]).max())
        run = lambda: fai._flash_attn_varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, scale, **mask)
    (out, lse, s_dmask, rng_state), names = cuda_kernel_names(run)
    assert s_dmask is None
    assert any("flashtile::sm90::fwd_kernel" in n for n in names), names
    dout = torch.randn_like(out)
    grads = [torch.empty_like(t) for t in (q, k, v)]
    if cu_seqlens is None:
        fai._flash_attn_backward(dout, q, k, v, out, lse, *grads, dropout_p, scale, causal, *window_size, softcap,
                                 alibi_slopes, False, rng_state)
    else:
        fai._flash_attn_varlen_backward(dout, q, k, v, out, lse, *grads, cu_q, cu_k, max_q, max_k, dropout_p, scale,
                                        causal, *window_size, softcap, alibi_slopes, False, rng_state)
    nheads = q.shape[-2]
    for b, rows_q, rows_k in sequences:
        one = (lambda t, rows: t[b:b + 1]) if cu_seqlens is None else (lambda t, rows: t[rows].unsqueeze(0))
        qb, kb, vb, db = one(q, rows_q), one(k, rows_k), one(v, rows_k), one(dout, rows_q)
        lse_b = lse[b:b + 1] if cu_seqlens is None else lse[:, rows_q].unsqueeze(0)
        if qb.shape[1] == 0:
            continue
        if kb.shape[1] == 0:  # no keys: out 0, lse -inf, dq 0 (the reference has no graph to differentiate)
            assert torch.all(one(out, rows_q) == 0) and torch.all(lse_b == float("-inf"))
            assert torch.all(one(grads[0], rows_q) == 0)
            continue
        keep = dropout_keep_mask(int(rng_state[0]), b, nheads, qb.shape[1], kb.shape[1], dropout_p, "cuda")
        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[b]
        opts = dict(causal=causal, window_size=window_size, softcap=softcap, alibi_slopes=slopes,
                    dropout_p=dropout_p, dropout_keep=keep.unsqueeze(0))
        ref_out, ref_lse = attention_ref(qb, kb, vb, **opts)
        pt_out, pt_lse = attention_ref(qb, kb, vb, upcast=False, **opts)
        assert_close_fa_rule(one(out, rows_q), ref_out, pt_out, f"out[{b}]")
        assert_close_fa_rule(lse_b, ref_lse, pt_lse, f"lse[{b}]")
        _, ref_grads = attention_ref_backward(qb, kb, vb, db, **opts)
        _, pt_grads = attention_ref_backward(qb, kb, vb, db, upcast=False, **opts)
        for name, got, rows, ref, pt in zip(("dq", "dk", "dv"), grads, (rows_q, rows_k, rows_k), ref_grads, pt_grads):
            assert_close_fa_rule(one(got, rows), ref, pt, f"{name}[{b}]", atol=GRAD_ATOL)


SM90_SCOREMOD_FWD_BUILT = sm90_built("fwd", "scoremod") if torch.cuda.get_device_capability() == (9, 0) else ()


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(203, 171), (64, 300)])
def test_wgmma_forward_with_dropout(mask, seqlen_q, seqlen_k):
    """Every head dim and dtype with a wgmma scoremod forward: dropout there
    draws the documented mask (GQA, rows and keys not multiples of a tile)."""
    require_sm90("fwd")
    if not SM90_SCOREMOD_FWD_BUILT:
        pytest.skip("this build has no sm90 scoremod forward (FLASHTILE_VARIANTS)")
    for head_dim, name in SM90_SCOREMOD_FWD_BUILT:
        q, k, v = rand_qkv(2, seqlen_q, seqlen_k, 4, 2, head_dim, DTYPES[name])
        check_wgmma_forward_with_dropout(q, k, v, 0.17, **MASKS[mask])


@pytest.mark.parametrize("mask", MASKS)
def test_wgmma_forward_with_dropout_softcap_alibi_and_varlen(mask):
    """Dropout beside softcap and ALiBi, on fixed-length and varlen batches
    (an empty sequence, one with no keys, lengths off the tiles)."""
    require_sm90("fwd")
    if not SM90_SCOREMOD_FWD_BUILT:
        pytest.skip("this build has no sm90 scoremod forward (FLASHTILE_VARIANTS)")
    for head_dim, name in SM90_SCOREMOD_FWD_BUILT:
        q, k, v = rand_qkv(2, 150, 130, 4, 4, head_dim, DTYPES[name])
        slopes = torch.rand(2, 4, device="cuda") * 0.3
        check_wgmma_forward_with_dropout(q, k, v, 0.25, softcap=2.0, alibi_slopes=slopes, **MASKS[mask])
        lengths_q, lengths_k = [0, 37, 201, 5, 130], [17, 0, 190, 64, 260]
        cu_q, cu_k = (torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
                      for lengths in (lengths_q, lengths_k))
        q = torch.randn(sum(lengths_q), 4, head_dim, device="cuda", dtype=DTYPES[name])
        k = torch.randn(sum(lengths_k), 2, head_dim, device="cuda", dtype=DTYPES[name])
        v = torch.randn_like(k)
        check_wgmma_forward_with_dropout(q, k, v, 0.3, cu_seqlens=(cu_q, cu_k), **MASKS[mask])


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 192, 256])
def test_every_head_dim(dtype_name, head_dim):
    require_built(head_dim, dtype_name)
    q, k, v = rand_qkv(1, 97, 150, 2, 2, head_dim, DTYPES[dtype_name])
    run_and_check(q, k, v, 0.3, causal=True)


def test_padded_head_dim():
    require_built(96, "bf16")
    q, k, v = rand_qkv(1, 70, 90, 2, 1, 80, torch.bfloat16)
    run_and_check(q, k, v, 0.25)


@pytest.mark.parametrize("mask", MASKS)
def test_with_softcap_and_alibi(mask):
    require_built(128, "bf16")
    q, k, v = rand_qkv(2, 150, 130, 4, 4, 128, torch.bfloat16)
    slopes = torch.rand(2, 4, device="cuda") * 0.3
    run_and_check(q, k, v, 0.2, softcap=2.0, alibi_slopes=slopes, **MASKS[mask])


def test_deterministic_backward_is_reproducible():
    require_built(64, "fp16")
    q, k, v = rand_qkv(2, 190, 170, 4, 1, 64, torch.float16)
    run_and_check(q, k, v, 0.4, causal=True, deterministic=True)
    dout = torch.randn(2, 190, 4, 64, device="cuda", dtype=torch.float16)
    grads = []
    for _ in range(2):
        torch.manual_seed(99)
        out = flashtile.flash_attn_func(q, k, v, dropout_p=0.4, causal=True, deterministic=True)
        grads.append(torch.autograd.grad(out, (q, k, v), dout))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_manual_seed_reproduces_a_call_and_other_seeds_differ():
    require_built(128, "bf16")
    q, k, v = rand_qkv(2, 256, 256, 4, 4, 128, torch.bfloat16)
    outs = []
    for torch_seed in (5, 5, 6):
        torch.manual_seed(torch_seed)
        outs.append(flashtile.flash_attn_func(q, k, v, dropout_p=0.1))
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], outs[2])
    # A call advances the generator: the next call draws another mask.
    torch.manual_seed(5)
    first = flashtile.flash_attn_func(q, k, v, dropout_p=0.1)
    second = flashtile.flash_attn_func(q, k, v, dropout_p=0.1)
    assert not torch.equal(first, second)


@pytest.mark.parametrize("dropout_p", [0.1, 0.5, 0.9])
def test_kept_fraction_within_statistical_bounds(dropout_p):
    """The kept fraction over 4 M scores, overall and for each of the 16
    bytes of a Philox call (quad lane and element: every position of the
    atoms), within 6 standard deviations of the keep probability drawn,
    threshold / 256 (p rounded to 1/256, common/dropout.hpp)."""
    require_built(64, "bf16")
    keep_probability = dropout_keep_probability(dropout_p)
    assert abs(keep_probability - (1 - dropout_p)) <= 1 / 512
    q, k, v = rand_qkv(1, 1024, 1024, 4, 4, 64, torch.bfloat16)
    with torch.no_grad():
        _, _, attn_probs = flashtile.flash_attn_func(q, k, v, dropout_p=dropout_p, return_attn_probs=True)
    kept = kept_by_kernel(attn_probs, 1024, 1024).float()
    rows = torch.arange(1024, device="cuda").view(-1, 1)
    cols = torch.arange(1024, device="cuda").view(1, -1)
    byte = (4 * ((cols % 8) // 2) + 2 * (rows % 16 >= 8) + cols % 2).expand(1024, 1024)
    for name, selected in [("all", torch.ones_like(byte, dtype=torch.bool))] + [
            (f"byte {b}", byte == b) for b in range(16)]:
        values = kept[:, :, selected]
        n = values.numel()
        sigma = math.sqrt(keep_probability * (1 - keep_probability) / n)
        fraction = values.mean().item()
        assert abs(fraction - keep_probability) < 6 * sigma, (
            f"{name}: kept {fraction:.5f} of {n}, expected {keep_probability} +- {6 * sigma:.5f}")


def test_attn_probs_magnitudes_are_the_unnormalized_probabilities():
    """|S_dmask| is exp(s - row max), flash_attn's form: each row's largest
    entry is 1, and times exp(row max - lse) it is the undropped softmax,
    which sums to 1 over the row's keys."""
    require_built(64, "bf16")
    q, k, v = rand_qkv(2, 200, 300, 4, 2, 64, torch.bfloat16)
    with torch.no_grad():
        _, lse, attn_probs = flashtile.flash_attn_func(q, k, v, dropout_p=0.3, causal=True, return_attn_probs=True)
    magnitudes = attn_probs[:, :, :200, :300].float().abs()
    assert torch.equal(magnitudes.amax(-1), torch.ones_like(lse))
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float().repeat_interleave(2, dim=2)) * 64 ** -0.5
    scores = scores.masked_fill(causal_mask(200, 300, "cuda"), float("-inf"))
    probs = magnitudes * torch.exp(scores.amax(-1, keepdim=True) - lse[..., None])
    row_sums = probs.sum(-1)
    torch.testing.assert_close(row_sums, torch.ones_like(row_sums), atol=2e-2, rtol=0)


def test_return_attn_probs_without_dropout_is_none():
    require_built(64, "bf16")
    q, k, v = rand_qkv(1, 64, 64, 2, 2, 64, torch.bfloat16)
    assert flashtile.flash_attn_func(q, k, v, return_attn_probs=True)[2] is None


@pytest.mark.parametrize("deterministic", [False, True])
def test_varlen(deterministic):
    require_built(64, "bf16")
    lengths_q, lengths_k = [0, 37, 128, 201, 5], [17, 0, 150, 190, 64]
    nheads, nheads_k, head_dim, p = 4, 2, 64, 0.25
    cu_q = torch.tensor([0] + lengths_q, device="cuda").cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lengths_k, device="cuda").cumsum(0).to(torch.int32)
    q = torch.randn(sum(lengths_q), nheads, head_dim, device="cuda", dtype=torch.bfloat16).requires_grad_()
    k = torch.randn(sum(lengths_k), nheads_k, head_dim, device="cuda", dtype=torch.bfloat16).requires_grad_()
    v = torch.randn_like(k).requires_grad_()
    key = seed_of_next_call(77)
    out, lse, attn_probs = flashtile.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), dropout_p=p, causal=True,
        deterministic=deterministic, return_attn_probs=True)
    assert attn_probs.shape == (5, nheads, 256, 256)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for b, (lq, lk) in enumerate(zip(lengths_q, lengths_k)):
        keep = dropout_keep_mask(key, b, nheads, lq, lk, p, "cuda")
        assert torch.equal(kept_by_kernel(attn_probs[b:b + 1], lq, lk)[0], keep)
        if lq == 0:
            continue
        rows_q = slice(int(cu_q[b]), int(cu_q[b + 1]))
        rows_k = slice(int(cu_k[b]), int(cu_k[b + 1]))
        if lk == 0:  # no keys: out 0, lse -inf, dq 0 (the reference has no graph to differentiate)
            assert torch.all(out[rows_q] == 0) and torch.all(lse[:, rows_q] == float("-inf"))
            assert torch.all(grads[0][rows_q] == 0)
            continue
        qb, kb, vb = (t.detach()[rows].unsqueeze(0) for t, rows in ((q, rows_q), (k, rows_k), (v, rows_k)))
        opts = dict(causal=True, dropout_p=p, dropout_keep=keep.unsqueeze(0))
        ref_out, ref_lse = attention_ref(qb, kb, vb, **opts)
        pt_out, pt_lse = attention_ref(qb, kb, vb, upcast=False, **opts)
        assert_close_fa_rule(out[rows_q].unsqueeze(0), ref_out, pt_out, f"out[{b}]")
        assert_close_fa_rule(lse[:, rows_q].unsqueeze(0), ref_lse, pt_lse, f"lse[{b}]")
        _, ref_grads = attention_ref_backward(qb, kb, vb, dout[rows_q].unsqueeze(0), **opts)
        _, pt_grads = attention_ref_backward(qb, kb, vb, dout[rows_q].unsqueeze(0), upcast=False, **opts)
        for name, got, rows, ref, pt in zip(("dq", "dk", "dv"), grads, (rows_q, rows_k, rows_k), ref_grads,
                                            pt_grads):
            assert_close_fa_rule(got[rows].unsqueeze(0), ref, pt, f"{name}[{b}]", atol=GRAD_ATOL)


def test_cuda_graph_replays_draw_new_masks_and_follow_manual_seed():
    require_built(64, "bf16")
    q, k, v = (t.detach() for t in rand_qkv(2, 128, 128, 4, 4, 64, torch.bfloat16))
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        flashtile.flash_attn_func(q, k, v, dropout_p=0.3)  # warm-up outside the capture
        with torch.cuda.graph(graph, stream=stream):
            out = flashtile.flash_attn_func(q, k, v, dropout_p=0.3)
    torch.cuda.current_stream().wait_stream(stream)
    replays = []
    for torch_seed in (11, None, 11):
        if torch_seed is not None:
            torch.manual_seed(torch_seed)
        graph.replay()
        replays.append(out.clone())
    assert not torch.equal(replays[0], replays[1]), "a replay reused the previous mask"
    assert torch.equal(replays[0], replays[2]), "torch.manual_seed did not reproduce the replay"


def test_torch_compile_fullgraph():
    require_built(64, "bf16")
    q, k, v = rand_qkv(2, 96, 80, 4, 2, 64, torch.bfloat16)

    @torch.compile(fullgraph=True)
    def attend(q, k, v):
        return flashtile.flash_attn_func(q, k, v, dropout_p=0.2, causal=True, return_attn_probs=True)

    out, lse, attn_probs = attend(q, k, v)
    keep = kept_by_kernel(attn_probs, 96, 80)
    check_against_reference(q, k, v, 0.2, keep, out, lse, causal=True)


def test_opcheck_with_dropout_and_probs():
    """flashtile::fwd's schema, fake and autograd registration with dropout
    and the probabilities (a fixed seed tensor: every run draws the same mask)."""
    require_built(64, "bf16")
    q, k, v = rand_qkv(2, 65, 130, 4, 2, 64, torch.bfloat16)
    seed = torch.tensor([12345], dtype=torch.int64, device="cuda")
    args = (q, k, v, 0.125, True, False, -1, -1, 0.0, None, None, None, None, 0, 0, 0.3, seed, True)
    torch.library.opcheck(torch.ops.flashtile.fwd.default, args, rtol=2e-2, atol=1e-3)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_runs_on_the_tensors_device():
    """q on the second GPU while the first is current: the seed comes from
    that device's generator and the mask and gradients are right there."""
    require_built(64, "bf16")
    device = torch.device("cuda", 1)
    torch.manual_seed(21)
    q, k, v = (torch.randn(1, 96, 2, 64, device=device, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    torch.cuda.manual_seed_all(5)
    with torch.cuda.device(device):
        key = int(_dropout_seed(device).item())
    torch.cuda.manual_seed_all(5)
    assert torch.cuda.current_device() == 0
    out, lse, attn_probs = flashtile.flash_attn_func(q, k, v, dropout_p=0.3, causal=True, return_attn_probs=True)
    keep = dropout_keep_mask(key, 0, 2, 96, 96, 0.3, device).unsqueeze(0)
    assert torch.equal(kept_by_kernel(attn_probs, 96, 96), keep)
    check_against_reference(q, k, v, 0.3, keep, out, lse, causal=True)
