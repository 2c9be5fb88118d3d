"""Randomized differential testing of flashtile against a float64 reference.

Each case draws every argument jointly from one seed: the function (the six
public ones and flash_attn's lower-level ``_flash_attn_*`` entry points with
preallocated, NaN-poisoned gradients), dtype, head dim 1-256, batch, seqlen_q
and seqlen_k independently from 1 to a few thousand (varlen batches with empty
and one-token sequences and ``seqused_k``), MQA/GQA ratios, causal, sliding
windows (0, small, past the sequence, one side only), softcap, ALiBi, dropout,
the softmax scale, odd layouts (non-contiguous, padded rows, misaligned
starts, a last dim with stride 2), ``deterministic`` and the dispatch arch
(with "sm80" the sm90 wgmma kernels are skipped, so one H100/H200 runs every
path; drawn on an H100/H200 only with a build that compiles the sm80 forward
for it, FLASHTILE_SM80_ON_SM90). It then checks out, the logsumexp and dq, dk,
dv against attention in float64 with FlashAttention's rule (error at most
twice PyTorch's own error in the input dtype, plus a slack at fp32 rounding),
rows that see no key (out and dq exactly 0, lse -inf), keys no row sees (dk,
dv exactly 0), dropout through the pattern S_dmask reports (its signs are the
mask, its magnitudes the unnormalized probabilities) or, in the dense
low-level form, which asks for no S_dmask, through the documented mask of the
seed in its rng_state, and the deterministic backward's bits over two runs.

The fast tier runs in the GPU suite (test_fuzz_gpu.py); the long tier:

    python tests/fuzz.py --cases 10000 --seed 1 --workers 8 --summary benchmarks/results/fuzz.txt

A failure prints its case; ``python tests/fuzz.py --replay SEED`` reruns it.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import os
import random
import subprocess
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import (assert_close_fa_rule, attention_ref, attention_ref_backward,  # noqa: E402
                       dropout_keep_mask, dropout_keep_probability, dropout_scale)

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
FORMS = ("func", "qkvpacked", "kvpacked", "varlen", "varlen_qkvpacked", "varlen_kvpacked", "lowlevel",
         "lowlevel_varlen")
LAYOUTS = ("contiguous", "heads_major", "row_padded", "misaligned", "last_dim_strided")
KERNEL_HEAD_DIMS = (32, 64, 96, 128, 192, 256)

# Slack on top of the 2x rule. Where PyTorch's low-precision error is 0 by
# structure (every row with one visible key: P = 1, dP = D, so its dq and dk
# cancel exactly) the kernels still carry (a) the fp32 rounding of their sums,
# bounded by FP32_REL times the sum of the terms' magnitudes (about 80 fp32
# ulps: sums of up to a few thousand products), and (b) FlashAttention's
# D = rowsum(dout * out) taken from out as stored, rounded to the input
# dtype; with dropout's 1 / (1 - p) that rounding no longer cancels against
# dP (_error_scales); and (c) the rounding of the exact result to the output
# dtype, half its spacing at the element (PyTorch's result rounds too, but a
# rare large element can round one way for it and the other for the kernels:
# the fuzzer's first long run failed once so, out 0.707031 against 0.704141,
# PyTorch's 0.703125 its one close element). LSE_SLACK: of max(1, |lse|).
FP32_REL = 1e-5
LSE_SLACK = 1e-5
EPS = {"fp16": 2.0 ** -10, "bf16": 2.0 ** -7}  # the spacing of the dtype's numbers at 1


@dataclasses.dataclass
class Case:
    seed: int
    form: str
    dtype: str
    head_dim: int
    nheads: int
    nheads_k: int
    seqlens_q: list  # per sequence; dense forms repeat one length
    seqlens_k: list
    seqused_k: list | None
    causal: bool
    window: tuple
    window_as_tensor: bool
    softcap: float
    alibi: str | None  # None, "heads" (nheads,), "batch" (batch, nheads)
    dropout_p: float
    softmax_scale: float | None
    layout: str
    deterministic: bool
    arch: str  # "sm90" (no limit) or "sm80"

    @property
    def varlen(self) -> bool:
        return self.form.startswith("varlen") or self.form == "lowlevel_varlen"

    @property
    def batch(self) -> int:
        return len(self.seqlens_q)

    def kernel(self) -> str:
        """The kernel family the case lands on, for the coverage summary."""
        variant = "scoremod" if (self.softcap > 0 or self.alibi or self.dropout_p > 0) else "plain"
        mask = "window" if self.window != (-1, -1) else "causal" if self.causal else "none"
        hd = next(d for d in KERNEL_HEAD_DIMS if d >= self.head_dim)
        return f"hdim{hd} {self.dtype} {variant} {mask} {'varlen' if self.varlen else 'dense'}"


def _seqlen(rng: random.Random, high: int) -> int:
    """1 to high, log-uniform-ish: tiny, short and long sequences alike."""
    bucket = rng.random()
    if bucket < 0.25:
        return rng.randint(1, min(16, high))
    if bucket < 0.65:
        return rng.randint(1, min(300, high))
    return rng.randint(1, high)


def _window_side(rng: random.Random, seqlen: int) -> int:
    r = rng.random()
    if r < 0.3:
        return -1
    if r < 0.45:
        return 0
    if r < 0.65:
        return rng.randint(1, 16)
    if r < 0.85:
        return rng.randint(1, max(1, seqlen))
    return seqlen + rng.randint(0, 2 * seqlen + 2)  # at or past the sequence


def draw_case(seed: int, built, max_seqlen: int = 3000, max_scores: int = 6_000_000,
              archs=("sm90", "sm80")) -> Case:
    """One case from its seed; ``built`` is {(kernel head dim, dtype name,
    variant)} of this build, so a partial build draws only what it has, and
    ``archs`` the dispatch limits that run here (dispatch_archs())."""
    rng = random.Random(seed)
    while True:
        dtype = rng.choice(sorted(DTYPES))
        head_dim = rng.choice(KERNEL_HEAD_DIMS) if rng.random() < 0.5 else rng.randint(1, 256)
        kernel_dim = next(d for d in KERNEL_HEAD_DIMS if d >= head_dim)
        softcap = rng.uniform(1.0, 50.0) if rng.random() < 0.15 else (-1.0 if rng.random() < 0.04 else 0.0)
        alibi = rng.choice(["heads", "batch"]) if rng.random() < 0.15 else None
        dropout_p = rng.choice([0.1, 0.17, 0.3, 0.5]) if rng.random() < 0.15 else 0.0
        variant = "scoremod" if (softcap > 0 or alibi or dropout_p > 0) else "plain"
        if (kernel_dim, dtype, variant) in built:
            break
    form = rng.choices(FORMS, weights=[25, 8, 8, 25, 7, 7, 10, 10])[0]
    nheads = rng.choice([1, 2, 3, 4, 6, 8, 12, 16])
    nheads_k = rng.choice([d for d in range(1, nheads + 1) if nheads % d == 0])
    if form in ("qkvpacked", "varlen_qkvpacked"):
        nheads_k = nheads
    if form.startswith("varlen") or form == "lowlevel_varlen":
        batch = rng.randint(1, 6)
        seqlens_q, seqlens_k = [], []
        for _ in range(batch):
            r = rng.random()  # empty and one-token sequences on either side
            sq = 0 if r < 0.08 else 1 if r < 0.16 else _seqlen(rng, max_seqlen)
            r = rng.random()
            sk = 0 if r < 0.08 else 1 if r < 0.16 else _seqlen(rng, max_seqlen)
            seqlens_q.append(sq)
            seqlens_k.append(sk)
        if form == "varlen_qkvpacked":
            seqlens_k = list(seqlens_q)
    else:
        batch = rng.randint(1, 4)
        sq = _seqlen(rng, max_seqlen)
        sk = sq if rng.random() < 0.25 else _seqlen(rng, max_seqlen)
        if form == "qkvpacked":
            sk = sq
        seqlens_q, seqlens_k = [sq] * batch, [sk] * batch
    # Bound the reference's (batch, nheads, seqlen_q, seqlen_k) float64 scores.
    while nheads * sum(a * b for a, b in zip(seqlens_q, seqlens_k)) > max_scores:
        seqlens_q = [max(1, s // 2) if s > 1 else s for s in seqlens_q]
        seqlens_k = list(seqlens_q) if form in ("qkvpacked", "varlen_qkvpacked") else \
            [max(1, s // 2) if s > 1 else s for s in seqlens_k]
    seqused_k = None
    if form == "varlen" and rng.random() < 0.3:
        seqused_k = [rng.randint(0, s) for s in seqlens_k]
    causal = rng.random() < 0.3
    window = (-1, -1)
    if rng.random() < 0.4:
        longest = max(max(seqlens_q), max(seqlens_k), 1)
        window = (_window_side(rng, longest), _window_side(rng, longest))
        if rng.random() < 0.1:  # flash_attn takes any negative side as unbounded
            window = tuple(-rng.randint(2, 9) if w == -1 else w for w in window)
    return Case(
        seed=seed, form=form, dtype=dtype, head_dim=head_dim, nheads=nheads, nheads_k=nheads_k,
        seqlens_q=seqlens_q, seqlens_k=seqlens_k, seqused_k=seqused_k, causal=causal, window=tuple(window),
        window_as_tensor=rng.random() < 0.15, softcap=softcap, alibi=alibi, dropout_p=dropout_p,
        softmax_scale=None if rng.random() < 0.7 else rng.uniform(0.02, 0.5),
        layout=rng.choices(LAYOUTS, weights=[50, 15, 12, 12, 11])[0],
        deterministic=rng.random() < 0.25, arch=rng.choice(list(archs)))


# --------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------


def _laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """t's values (a leaf that requires grad) in one of the layouts the
    functions must take; gradients reach the returned leaf."""
    if layout == "heads_major" and t.dim() >= 3:  # (..., s, h, d) stored as (..., h, s, d)
        base = t.detach().transpose(-3, -2).contiguous().transpose(-3, -2)
    elif layout == "row_padded":  # rows of d + 3 elements: not 16-byte aligned
        base = torch.zeros(*t.shape[:-1], t.shape[-1] + 3, dtype=t.dtype, device=t.device)[..., :t.shape[-1]]
        base.copy_(t.detach())
    elif layout == "misaligned":  # starts one element past a 16-byte boundary
        flat = torch.zeros(t.numel() + 8, dtype=t.dtype, device=t.device)
        base = flat[1:1 + t.numel()].view(t.shape).copy_(t.detach())
    elif layout == "last_dim_strided":
        base = torch.zeros(*t.shape, 2, dtype=t.dtype, device=t.device)[..., 0].copy_(t.detach())
    else:
        base = t.detach().clone()
    return base.requires_grad_()


def _slopes(case: Case, gen: torch.Generator, device):
    if case.alibi is None:
        return None
    shape = (case.nheads,) if case.alibi == "heads" else (case.batch, case.nheads)
    return (torch.rand(shape, generator=gen, device=device) * 0.3).float()


def _window_arg(case: Case):
    return torch.tensor(case.window) if case.window_as_tensor else case.window


def _visible(sq: int, sk: int, case: Case, device) -> torch.Tensor:
    """(sq, sk) bool: which keys each row sees under the mask (documented
    semantics: row i sees j iff i + sk - sq - left <= j <= i + sk - sq + right,
    negative sides unbounded; causal: right = 0)."""
    left, right = case.window
    if case.causal:
        right = 0
    rows = torch.arange(sq, device=device)[:, None] + (sk - sq)
    cols = torch.arange(sk, device=device)[None, :]
    seen = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        seen &= cols >= rows - left
    if right >= 0:
        seen &= cols <= rows + right
    return seen


# --------------------------------------------------------------------------
# running a case
# --------------------------------------------------------------------------


def _call_flashtile(case: Case, q, k, v, slopes, dout):
    """flashtile's out, lse, S_dmask, (dq, dk, dv) and the dropout seed
    where the form returns it (the low-level ones' rng_state), for the case's
    form. q (total or batch rows...), k, v are leaves in the case's layout."""
    import flashtile
    from flashtile.compat import flash_attn_interface as fai

    window = _window_arg(case)
    opts = dict(dropout_p=case.dropout_p, softmax_scale=case.softmax_scale, causal=case.causal,
                window_size=window, softcap=case.softcap, alibi_slopes=slopes, deterministic=case.deterministic,
                return_attn_probs=True)
    device = q.device
    cu_q = torch.tensor([0] + list(_cumsum(case.seqlens_q)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(_cumsum(case.seqlens_k)), dtype=torch.int32, device=device)
    max_q, max_k = max(case.seqlens_q), max(case.seqlens_k)

    if case.form.startswith("lowlevel"):
        return _call_lowlevel(case, fai, q, k, v, slopes, dout, cu_q, cu_k, max_q, max_k)
    if case.form == "func":
        out, lse, s = flashtile.flash_attn_func(q, k, v, **opts)
    elif case.form == "qkvpacked":
        qkv = _laid_out(torch.stack([q, k, v], dim=2), case.layout)
        out, lse, s = flashtile.flash_attn_qkvpacked_func(qkv, **opts)
    elif case.form == "kvpacked":
        kv = _laid_out(torch.stack([k, v], dim=2), case.layout)
        out, lse, s = flashtile.flash_attn_kvpacked_func(q, kv, **opts)
    elif case.form == "varlen":
        seqused = (torch.tensor(case.seqused_k, dtype=torch.int32, device=device)
                   if case.seqused_k is not None else None)
        out, lse, s = flashtile.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k=seqused, **opts)
    elif case.form == "varlen_qkvpacked":
        qkv = _laid_out(torch.stack([q, k, v], dim=1), case.layout)
        out, lse, s = flashtile.flash_attn_varlen_qkvpacked_func(qkv, cu_q, max_q, **opts)
    else:
        kv = _laid_out(torch.stack([k, v], dim=1), case.layout)
        out, lse, s = flashtile.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, max_q, max_k, **opts)
    if case.form in ("qkvpacked", "varlen_qkvpacked"):
        inputs, unpack = (qkv,), lambda g: g[0].unbind(2 if case.form == "qkvpacked" else 1)
    elif case.form in ("kvpacked", "varlen_kvpacked"):
        inputs, unpack = (q, kv), lambda g: (g[0], *g[1].unbind(2 if case.form == "kvpacked" else 1))
    else:
        inputs, unpack = (q, k, v), tuple
    grads = unpack(torch.autograd.grad(out, inputs, dout, retain_graph=case.deterministic))
    if case.deterministic:  # the same graph (and dropout seed) again: the same bits
        again = unpack(torch.autograd.grad(out, inputs, dout))
        for name, a, b in zip(("dq", "dk", "dv"), grads, again):
            assert torch.equal(a, b), f"{name}: deterministic backward differs between two runs"
    return out, lse, s, tuple(grads), None


def _call_lowlevel(case, fai, q, k, v, slopes, dout, cu_q, cu_k, max_q, max_k):
    """flash_attn's _flash_attn_forward / _backward (or the varlen ones) with
    dq, dk, dv preallocated and NaN-filled: every element must be written.
    With dropout the varlen form asks for S_dmask, the dense one does not:
    its mask is checked against the documented one of its seed."""
    left, right = case.window
    scale = case.softmax_scale
    q, k, v = q.detach(), k.detach(), v.detach()
    if case.form == "lowlevel":
        out, lse, s, rng_state = fai._flash_attn_forward(q, k, v, case.dropout_p, scale, case.causal, left, right,
                                                         case.softcap, slopes, False)
    else:
        out, lse, s, rng_state = fai._flash_attn_varlen_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, case.dropout_p, scale, case.causal, left, right, case.softcap, slopes,
            case.dropout_p > 0)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    runs = 2 if case.deterministic else 1
    first = None
    for _ in range(runs):
        if case.form == "lowlevel":
            d = fai._flash_attn_backward(dout, q, k, v, out, lse, *grads, case.dropout_p, scale, case.causal, left,
                                         right, case.softcap, slopes, case.deterministic, rng_state)
        else:
            d = fai._flash_attn_varlen_backward(dout, q, k, v, out, lse, *grads, cu_q, cu_k, max_q, max_k,
                                                case.dropout_p, scale, case.causal, left, right, case.softcap, slopes,
                                                case.deterministic, rng_state)
        if first is None:
            first = [g.clone() for g in grads]
        else:
            for name, a, b in zip(("dq", "dk", "dv"), first, grads):
                assert torch.equal(a, b), f"{name}: deterministic backward differs between two runs"
    rows = (dout.float() * out.float()).sum(-1)
    expect = rows.transpose(-1, -2) if case.form == "lowlevel" else rows.transpose(0, 1)
    got = d[..., :expect.shape[-1]]
    assert torch.allclose(got, expect, rtol=1e-5, atol=1e-5), "softmax_d is not rowsum(dout * out)"
    seed = int(rng_state.reshape(-1)[0]) if case.dropout_p > 0 else None
    return out, lse, s, tuple(grads), seed


def _cumsum(xs):
    total = 0
    for x in xs:
        total += x
        yield total


def run_case(case: Case, device: str = "cuda") -> None:
    """Runs the case; raises AssertionError (naming the quantity) on a failure."""
    from flashtile import _C

    _C.limit_dispatch_arch(case.arch)
    dtype = DTYPES[case.dtype]
    gen = torch.Generator(device=device)
    gen.manual_seed(case.seed)
    d = case.head_dim
    if case.varlen:
        shapes = ((sum(case.seqlens_q), case.nheads, d), (sum(case.seqlens_k), case.nheads_k, d))
    else:
        shapes = ((case.batch, case.seqlens_q[0], case.nheads, d), (case.batch, case.seqlens_k[0], case.nheads_k, d))
    q0 = torch.randn(shapes[0], generator=gen, device=device, dtype=torch.float32).to(dtype)
    k0 = torch.randn(shapes[1], generator=gen, device=device, dtype=torch.float32).to(dtype)
    v0 = torch.randn(shapes[1], generator=gen, device=device, dtype=torch.float32).to(dtype)
    if case.softcap > 0:
        q0 = (q0.float() * case.softcap / 4).to(dtype)  # scores reach into the cap's bend
    dout = torch.randn(shapes[0], generator=gen, device=device, dtype=torch.float32).to(dtype)
    slopes = _slopes(case, gen, device)
    # Packed forms lay out the packed tensor (_call_flashtile); q of kvpacked keeps the case's layout.
    packed_kv = case.form in ("qkvpacked", "kvpacked", "varlen_qkvpacked", "varlen_kvpacked")
    q = _laid_out(q0, case.layout)
    k, v = (_laid_out(t, "contiguous" if packed_kv else case.layout) for t in (k0, v0))

    out, lse, s_dmask, grads, seed = _call_flashtile(case, q, k, v, slopes, dout)
    _check_against_reference(case, q0, k0, v0, dout, slopes, out, lse, s_dmask, grads, seed)


def _sequences(case: Case):
    """(b, q rows slice, k rows slice, seqlen_q, seqlen_k used) per sequence."""
    qs = ks = 0
    for b, (sq, sk) in enumerate(zip(case.seqlens_q, case.seqlens_k)):
        used = sk if case.seqused_k is None else case.seqused_k[b]
        yield b, slice(qs, qs + sq), slice(ks, ks + sk), sq, used
        qs, ks = qs + sq, ks + sk


def _check_against_reference(case, q0, k0, v0, dout, slopes, out, lse, s_dmask, grads, seed):
    scale = case.softmax_scale if case.softmax_scale is not None else case.head_dim ** -0.5
    softcap = max(case.softcap, 0.0)
    left, right = case.window
    window = (max(left, -1), max(right, -1))
    dq, dk, dv = grads
    if not case.varlen:  # view the dense batch as sequences of one packed batch
        b, sq, h, d = q0.shape
        sk = k0.shape[1]
        flat = lambda t: t.reshape(-1, *t.shape[2:])  # noqa: E731
        q0, k0, v0, dout, out, dq, dk, dv = map(flat, (q0, k0, v0, dout, out, dq, dk, dv))
        lse = lse.permute(1, 0, 2).reshape(h, b * sq)
    refs = {name: torch.zeros(t.shape, dtype=torch.float64, device=t.device)
            for name, t in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv))}
    refs["lse"] = torch.full(lse.shape, float("-inf"), dtype=torch.float64, device=lse.device)
    pts = {name: torch.zeros(t.shape, dtype=q0.dtype, device=t.device) for name, t in refs.items()}
    pts["lse"] = torch.full(lse.shape, float("-inf"), dtype=torch.float32, device=lse.device)
    slack = {name: torch.zeros_like(refs[name]) for name in ("out", "dq", "dk", "dv")}
    row_empty = torch.zeros(out.shape[0], out.shape[1], dtype=torch.bool, device=out.device)
    key_unseen = torch.zeros(dk.shape[0], dk.shape[1], dtype=torch.bool, device=dk.device)
    probs_checks = []  # dropout: each sequence's S_dmask, checked after the main quantities
    for b, qr, kr, sq, used in _sequences(case):
        kr_used = slice(kr.start, kr.start + used)
        if sq == 0:
            continue
        seen = _visible(sq, used, case, q0.device)  # (sq, used)
        row_empty[qr] = (~seen.any(dim=1))[:, None].expand(sq, out.shape[1])
        if kr.stop > kr.start:
            unseen = torch.ones(kr.stop - kr.start, dtype=torch.bool, device=q0.device)
            if used:
                unseen[:used] = ~seen.any(dim=0)
            key_unseen[kr] = unseen[:, None].expand(-1, dk.shape[1])
        if used == 0:
            continue  # out 0, lse -inf, no gradient: the zero-filled refs
        keep = None
        if case.dropout_p > 0 and s_dmask is not None:
            keep = ~torch.signbit(s_dmask[b, :, :sq, :used])[None]  # (1, h, sq, used)
        elif case.dropout_p > 0:
            keep = dropout_keep_mask(seed, b, q0.shape[1], sq, used, case.dropout_p, q0.device)[None]
        args = dict(causal=case.causal, softmax_scale=scale, window_size=window, softcap=softcap,
                    alibi_slopes=None if slopes is None else (slopes if slopes.dim() == 1 else slopes[b]),
                    dropout_p=case.dropout_p, dropout_keep=keep)
        qb, kb, vb, db = (t[None] for t in (q0[qr], k0[kr_used], v0[kr_used], dout[qr]))
        ref_out, ref_lse = attention_ref(*(t.double() for t in (qb, kb, vb)), **args)
        pt_out, pt_lse = attention_ref(qb, kb, vb, upcast=False, **args)
        _, ref_grads = attention_ref_backward(*(t.double() for t in (qb, kb, vb)), db.double(), **args)
        _, pt_grads = attention_ref_backward(qb, kb, vb, db, upcast=False, **args)
        refs["out"][qr], pts["out"][qr] = ref_out[0], pt_out[0]
        refs["lse"][:, qr], pts["lse"][:, qr] = ref_lse[0], pt_lse[0].float()
        refs["dq"][qr], pts["dq"][qr] = ref_grads[0][0], pt_grads[0][0]
        refs["dk"][kr_used], pts["dk"][kr_used] = ref_grads[1][0], pt_grads[1][0]
        refs["dv"][kr_used], pts["dv"][kr_used] = ref_grads[2][0], pt_grads[2][0]
        scales = _error_scales(case, qb, kb, vb, db, ref_out, ref_lse, args)
        for name in ("out", "dq"):
            slack[name][qr] = scales[name]
        for name in ("dk", "dv"):
            slack[name][kr_used] = scales[name]
        if case.dropout_p > 0 and s_dmask is not None:
            probs_checks.append((b, sq, used, qb, kb, ref_lse[0], pt_lse[0], args))

    for name in ("out", "dq", "dk", "dv"):  # the rounding of the exact result to the output dtype
        slack[name] += EPS[case.dtype] / 2 * refs[name].abs()
    got = {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
    finite_lse = refs["lse"][torch.isfinite(refs["lse"])]
    atol = {"lse": LSE_SLACK * max(1.0, finite_lse.abs().max().item() if finite_lse.numel() else 0.0)}
    for name in ("out", "dq", "dk", "dv"):
        atol[name] = 1e-6 + (slack[name].max().item() if slack[name].numel() else 0.0)
    for name in ("out", "lse", "dq", "dk", "dv"):
        assert_close_fa_rule(got[name], refs[name], pts[name], name, atol=atol[name])
    assert (out[row_empty] == 0).all(), "out: a row that sees no key is not 0"
    assert (dq[row_empty] == 0).all(), "dq: a row that sees no key has a gradient"
    assert (dk[key_unseen] == 0).all() and (dv[key_unseen] == 0).all(), "dk/dv: a key no row sees has a gradient"
    for b, sq, used, qb, kb, ref_lse, pt_lse, args in probs_checks:
        _check_s_dmask(case, s_dmask[b, :, :sq, :used], qb, kb, ref_lse, pt_lse, args)


def _error_scales(case, qb, kb, vb, db, ref_out, ref_lse, args):
    """Per element of out, dq (rows of q) and dk, dv (rows of k) of one
    sequence, the rounding slack the kernels may add to the 2x rule (see
    FP32_REL): FP32_REL times the magnitude sum of the terms each result sums
    (|P| |v| for out; P (|dP| + |D|) |k| and |q| for dq, dk; |P| |dout| for
    dv, with dropout's keep scale), plus, for dq and dk, the effect of D read
    from out rounded to the input dtype (half its spacing times the
    magnitude of D). Softcap's derivative is at most 1 and ALiBi's 0, so
    leaving them out keeps these upper bounds. float64, (rows, heads, d)."""
    h, hk = qb.shape[2], kb.shape[2]
    group = h // hk
    scale = args["softmax_scale"]
    s = _scores(case, qb, kb, args, upcast=True)  # (h, sq, sk)
    lse = ref_lse[0].double()[..., None]
    p = torch.where(torch.isfinite(lse), torch.exp(s - lse), torch.zeros_like(s))
    keep = args["dropout_keep"]
    p_kept = p if keep is None else p * keep[0].double() * dropout_scale(case.dropout_p)
    heads_first = lambda t, g=1: t[0].double().abs().repeat_interleave(g, dim=1).transpose(0, 1)  # noqa: E731
    qa, ka, va, da = heads_first(qb), heads_first(kb, group), heads_first(vb, group), heads_first(db)
    oa = ref_out[0].double().abs().transpose(0, 1)  # (h, sq, d)
    d_mag = (da * oa).sum(-1, keepdim=True)  # (h, sq, 1): |D|'s terms
    dp_mag = torch.einsum("hqd,hkd->hqk", da, va)
    if keep is not None:
        dp_mag = dp_mag * keep[0].double() * dropout_scale(case.dropout_p)
    terms = p * (dp_mag + d_mag)
    d_rounding = p * (EPS[case.dtype] / 2 * d_mag)

    def per_kv_head(t):  # (h, sk, d) summed over each K/V head's group of query heads
        return t.reshape(hk, group, *t.shape[1:]).sum(1)

    out_mag = torch.einsum("hqk,hkd->hqd", p_kept, va)
    dq_mag = scale * (FP32_REL * torch.einsum("hqk,hkd->hqd", terms, ka)
                      + torch.einsum("hqk,hkd->hqd", d_rounding, ka))
    dk_mag = scale * per_kv_head(FP32_REL * torch.einsum("hqk,hqd->hkd", terms, qa)
                                 + torch.einsum("hqk,hqd->hkd", d_rounding, qa))
    dv_mag = per_kv_head(torch.einsum("hqk,hqd->hkd", p_kept, da))
    return {"out": (FP32_REL * out_mag).transpose(0, 1), "dq": dq_mag.transpose(0, 1),
            "dk": dk_mag.transpose(0, 1), "dv": (FP32_REL * dv_mag).transpose(0, 1)}


def _scores(case, q, k, args, upcast):
    """The modified, masked scores (h, sq, sk) of one sequence, computed as
    attention_ref does (float64, or the input dtype)."""
    from reference import alibi_bias
    dtype = torch.float64 if upcast else q.dtype
    h, hk = q.shape[2], k.shape[2]
    qd, kd = q[0].to(dtype), k[0].repeat_interleave(h // hk, dim=1).to(dtype)
    s = torch.einsum("qhd,khd->hqk", qd, kd) * args["softmax_scale"]
    if args["softcap"] > 0:
        s = args["softcap"] * torch.tanh(s / args["softcap"])
    if args["alibi_slopes"] is not None:
        wide = torch.float64 if upcast else torch.float32
        s = (s.to(wide) + alibi_bias(args["alibi_slopes"], 1, h, s.shape[1], s.shape[2], s.device, wide)[0]).to(dtype)
    return s.masked_fill(~_visible(s.shape[1], s.shape[2], case, s.device), float("-inf"))


def _check_s_dmask(case, s_dmask, qb, kb, ref_lse, pt_lse, args):
    """S_dmask of one sequence (h, sq, sk): |S| * exp(rowmax - lse) is the
    probability (2x rule against PyTorch's), and the kept fraction is near
    the kernels' keep probability where enough scores are visible."""
    ref_s = _scores(case, qb, kb, args, upcast=True)
    pt_s = _scores(case, qb, kb, args, upcast=False)
    ref_max = ref_s.amax(-1, keepdim=True)
    ref_max = torch.where(torch.isinf(ref_max), torch.zeros_like(ref_max), ref_max)
    ref_lse = ref_lse[..., None].double()
    ref_p = torch.exp(ref_s - ref_lse)
    pt_p = torch.exp(pt_s.float() - pt_lse[..., None].float()).to(qb.dtype)
    got_p = s_dmask.abs().double() * torch.exp(ref_max - ref_lse)
    empty = torch.isneginf(ref_lse).expand_as(ref_p)  # rows that see no key: 0 everywhere
    ref_p, pt_p, got_p = (torch.where(empty, torch.zeros_like(t), t) for t in (ref_p, pt_p, got_p))
    # Two roundings to the dtype: the kernels' P, then P over the row's max.
    atol = LSE_SLACK + EPS[case.dtype] * ref_p.abs().max().item()
    assert_close_fa_rule(got_p, ref_p, pt_p, "S_dmask probabilities", atol=atol)
    visible = torch.isfinite(ref_s)
    n = int(visible.sum())
    if n >= 20000:
        kept = (~torch.signbit(s_dmask))[visible].double().mean().item()
        expected = dropout_keep_probability(case.dropout_p)
        tolerance = 6 * math.sqrt(expected * (1 - expected) / n) + 0.005
        assert abs(kept - expected) <= tolerance, f"S_dmask: kept fraction {kept:.4f}, expected {expected:.4f}"


# --------------------------------------------------------------------------
# the long tier
# --------------------------------------------------------------------------


def built_combos():
    """{(head dim, dtype name, variant)} with both a forward and a backward kernel in this build."""
    from flashtile import _C
    kernels = _C.built_kernels()
    fwd = {(int(hd), str(dt), str(var)) for direction, _a, hd, dt, var in kernels if direction == "fwd"}
    bwd = {(int(hd), str(dt), str(var)) for direction, _a, hd, dt, var in kernels if direction == "bwd"}
    return fwd & bwd


def dispatch_archs() -> tuple[str, ...]:
    """The dispatch limits a case may draw on this GPU and build: "sm80" only
    where a forward so limited runs here (kernel_names.sm80_forward_runs_here:
    not on an H100/H200 whose build compiled the sm80 forward for other GPUs
    only, the default)."""
    from kernel_names import sm80_forward_runs_here
    return ("sm90", "sm80") if sm80_forward_runs_here() else ("sm90",)


def case_seed(master: int, index: int) -> int:
    return (master * 1_000_003 + index) & (2**62 - 1)


def _worker(args):
    master, indices, max_seqlen = args
    built, archs = built_combos(), dispatch_archs()
    results = []
    for i in indices:
        case = draw_case(case_seed(master, i), built, max_seqlen=max_seqlen, archs=archs)
        try:
            run_case(case)
            results.append((i, case.kernel(), case.form, case.arch, None))
        except Exception as exc:  # noqa: BLE001 - every failure is recorded with its case
            results.append((i, case.kernel(), case.form, case.arch,
                            f"{type(exc).__name__}: {exc}\n{json.dumps(dataclasses.asdict(case))}\n"
                            + traceback.format_exc(limit=3)))
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=8, help="processes sharing the GPU")
    parser.add_argument("--max-seqlen", type=int, default=3000)
    parser.add_argument("--summary", help="write the summary here")
    parser.add_argument("--replay", type=int, help="rerun the case of this seed and print it")
    parser.add_argument("--commit", help="the commit the summary names (default: git's HEAD here)")
    parser.add_argument("--time-limit", type=float, default=0.0,
                        help="seconds after which no more cases start (0: none); the summary counts those run")
    args = parser.parse_args(argv)

    if args.replay is not None:
        case = draw_case(args.replay, built_combos(), max_seqlen=args.max_seqlen, archs=dispatch_archs())
        print(json.dumps(dataclasses.asdict(case)))
        run_case(case)
        print("passed")
        return 0

    import multiprocessing as mp
    start = time.time()
    chunks = [list(range(i, min(i + 20, args.cases))) for i in range(0, args.cases, 20)]
    results = []
    with mp.get_context("spawn").Pool(args.workers) as pool:
        for part in pool.imap_unordered(_worker, [(args.seed, c, args.max_seqlen) for c in chunks]):
            results.extend(part)
            if args.time_limit and time.time() - start > args.time_limit:
                pool.terminate()  # the summary says how many cases ran
                break
    elapsed = time.time() - start
    failures = [r for r in results if r[4] is not None]
    by_kernel = collections.Counter(r[1] for r in results)
    by_form = collections.Counter(r[2] for r in results)
    by_arch = collections.Counter(r[3] for r in results)
    lines = [
        f"# flashtile fuzz (tests/fuzz.py), long tier: {_provenance(args.commit)}",
        "# command: python tests/fuzz.py " + " ".join(sys.argv[1:] if argv is None else argv),
        f"cases: {len(results)} of {args.cases}  seed: {args.seed}  failures: {len(failures)}  seconds: {elapsed:.0f}",
        "by form: " + ", ".join(f"{k} {v}" for k, v in sorted(by_form.items())),
        "by dispatch limit: " + ", ".join(f"{k} {v}" for k, v in sorted(by_arch.items())),
        f"kernel families hit: {len(by_kernel)}",
    ]
    lines += [f"  {v:5d}  {k}" for k, v in sorted(by_kernel.items())]
    for i, kernel, form, arch, message in failures:
        lines.append(f"FAILED case {i} (seed {case_seed(args.seed, i)}, {form}, {kernel}, {arch}): {message}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.summary:
        with open(args.summary, "w") as f:
            f.write(text)
    return 1 if failures else 0


def _provenance(commit=None) -> str:
    if commit is None:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "?"
        except OSError:
            commit = "?"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"{gpu}, torch {torch.__version__}, commit {commit}, {time.strftime('%Y-%m-%d')}"


if __name__ == "__main__":
    sys.exit(main())
