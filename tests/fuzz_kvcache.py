"""Randomized differential testing of flashtile.flash_attn_with_kvcache
against float64 attention.

Each case draws every argument jointly from one seed: dtype, head dim
(mostly the kernels' own, sometimes any from 1 to 256), batch, query heads
and their GQA group, seqlen_q (mostly 1, as decoding), a dense cache (with or
without cache_batch_idx and cache_leftpad) or a paged one (page sizes from 1
to 512, odd ones included), each sequence's cached length (empty and full
among them), new keys appended in place (with rotary embedding of any even
rotary dim, either layout), causal, sliding windows, softcap, ALiBi, the
softmax scale and num_splits. Every cache row outside what the sequences
use, and every page no sequence owns, holds NaN: a read outside the visible
keys shows. It checks the appended rows bit for bit and that nothing else
in the cache moved, then out and the logsumexp of every sequence against
attention in float64 over its keys with FlashAttention's rule (twice
PyTorch's own error in the input dtype).

The fast tier runs in the GPU suite (test_kvcache_gpu.py); the long tier:

    python tests/fuzz_kvcache.py --cases 5000 --seed 1 --summary benchmarks/results/fuzz-kvcache.txt

A failure prints its case; ``--replay SEED`` reruns it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fuzz import _provenance  # noqa: E402
from reference import assert_close_fa_rule, attention_ref  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
KERNEL_HEAD_DIMS = (32, 64, 96, 128, 192, 256)
PAGE_SIZES = (1, 7, 16, 48, 64, 256, 512)
LSE_SLACK = 1e-5  # of max(1, |lse|): the kernels' fp32 sums and approximate exp2/log


@dataclasses.dataclass
class KvCase:
    seed: int
    dtype: str
    head_dim: int
    batch: int
    nheads: int
    nheads_k: int
    seqlen_q: int
    page_size: int | None  # None: a dense cache
    capacity: int          # keys a sequence's entry (or row of pages) holds
    batch_idx: bool        # dense: sequences pick entries of a larger cache
    leftpad: list | None   # dense: where each sequence's keys start
    seqlens: list          # keys cached before the call
    seqlens_as_int: bool   # cache_seqlens passed as one int (all equal)
    seqlen_new: int        # new keys appended (0: none)
    rotary_dim: int        # 0: no rotary embedding
    rotary_interleaved: bool
    causal: bool
    window: tuple
    softcap: float
    alibi: str | None      # None, "head" (nheads,) or "batch" (batch, nheads)
    softmax_scale: float | None
    num_splits: int


def draw_case(seed: int, built) -> KvCase:
    """A case among the built (head_dim, dtype) KV-cache kernels."""
    rng = random.Random(seed)
    kernel_dim, dtype = rng.choice(sorted(built))
    head_dim = kernel_dim if rng.random() < 0.8 else rng.randint(
        max(1, max((d for d in KERNEL_HEAD_DIMS if d < kernel_dim), default=0) + 1), kernel_dim)
    batch = rng.randint(1, 6)
    nheads_k = rng.choice((1, 2, 4))
    nheads = nheads_k * rng.choice((1, 2, 4, 8))
    seqlen_q = 1 if rng.random() < 0.5 else rng.choice((rng.randint(2, 8), rng.randint(9, 64)))
    paged = rng.random() < 0.5
    page_size = rng.choice(PAGE_SIZES) if paged else None
    if paged:
        capacity = page_size * rng.randint(1, max(1, 2500 // page_size))
    else:
        capacity = rng.randint(1, 2500)
    seqlen_new = 0 if rng.random() < 0.5 else rng.randint(1, min(capacity, max(1, seqlen_q)))
    room = capacity - seqlen_new

    def length():
        r = rng.random()
        return 0 if r < 0.1 else room if r < 0.2 else rng.randint(0, room)

    seqlens = [length() for _ in range(batch)]
    seqlens_as_int = rng.random() < 0.15
    if seqlens_as_int:
        seqlens = [seqlens[0]] * batch
    leftpad = None
    if not paged and rng.random() < 0.3:
        leftpad = [rng.randint(0, n + seqlen_new) for n in seqlens]
    rotary_dim = 0
    if seqlen_new and rng.random() < 0.5 and head_dim >= 2:
        rotary_dim = 2 * rng.randint(1, head_dim // 2)
    causal = rng.random() < 0.4
    window = (-1, -1)
    if rng.random() < 0.25:
        window = tuple(rng.choice((-1, 0, rng.randint(1, 64), rng.randint(65, 3000))) for _ in range(2))
    return KvCase(
        seed=seed, dtype=dtype, head_dim=head_dim, batch=batch, nheads=nheads, nheads_k=nheads_k,
        seqlen_q=seqlen_q, page_size=page_size, capacity=capacity,
        batch_idx=not paged and rng.random() < 0.3, leftpad=leftpad, seqlens=seqlens,
        seqlens_as_int=seqlens_as_int, seqlen_new=seqlen_new, rotary_dim=rotary_dim,
        rotary_interleaved=rng.random() < 0.5, causal=causal, window=window,
        softcap=rng.choice((5.0, 30.0)) if rng.random() < 0.15 else 0.0,
        alibi=rng.choice(("head", "batch")) if rng.random() < 0.15 else None,
        softmax_scale=rng.uniform(0.02, 0.5) if rng.random() < 0.2 else None,
        num_splits=rng.choice((0, 0, 1, rng.randint(2, 16))))


class _Cache:
    """A case's dense or paged cache: the tensors the call gets, and each
    sequence's rows as a (capacity, nheads_k, head_dim) view."""

    def __init__(self, case: KvCase, gen: torch.Generator, dtype, device):
        shape = (case.nheads_k, case.head_dim)
        self.case = case
        if case.page_size is None:
            entries = case.batch + (3 if case.batch_idx else 0)
            self.k = torch.randn(entries, case.capacity, *shape, generator=gen).to(dtype)
            self.v = torch.randn(entries, case.capacity, *shape, generator=gen).to(dtype)
            self.entry = (torch.randperm(entries, generator=gen)[:case.batch] if case.batch_idx
                          else torch.arange(case.batch))
            self.table = None
        else:
            pages = case.capacity // case.page_size
            pool = case.batch * pages + 2
            self.k = torch.randn(pool, case.page_size, *shape, generator=gen).to(dtype)
            self.v = torch.randn(pool, case.page_size, *shape, generator=gen).to(dtype)
            self.table = torch.randperm(pool, generator=gen)[:case.batch * pages].reshape(case.batch, pages)
            self.entry = None
        self.k, self.v = self.k.to(device), self.v.to(device)
        # NaN everywhere no sequence's visible keys are (and where the new ones go).
        keep_k, keep_v = self.k.clone(), self.v.clone()
        self.k.fill_(float("nan"))
        self.v.fill_(float("nan"))
        for b in range(case.batch):
            lo = 0 if case.leftpad is None else case.leftpad[b]
            rows = torch.arange(lo, max(lo, case.seqlens[b]))
            if len(rows):
                index = self.index(b, rows)
                self.k[index], self.v[index] = keep_k[index], keep_v[index]

    def index(self, b: int, positions: torch.Tensor):
        """Index tuple of sequence b's key positions in the cache tensors."""
        positions = positions.to(self.k.device)
        if self.table is None:
            return self.entry[b].to(self.k.device).expand_as(positions), positions
        pages = self.table[b].to(self.k.device)[positions // self.case.page_size]
        return pages, positions % self.case.page_size

    def rows(self, tensor: torch.Tensor, b: int) -> torch.Tensor:
        return tensor[self.index(b, torch.arange(self.case.capacity))]


def run_case(case: KvCase, device: str = "cuda") -> None:
    import flashtile
    from flashtile.rotary import apply_rotary_emb

    dtype = DTYPES[case.dtype]
    gen = torch.Generator().manual_seed(case.seed)
    cache = _Cache(case, gen, dtype, device)
    d, hk = case.head_dim, case.nheads_k
    q = torch.randn(case.batch, case.seqlen_q, case.nheads, d, generator=gen).to(dtype).to(device)
    k_new = v_new = cos = sin = slopes = None
    if case.seqlen_new:
        k_new = torch.randn(case.batch, case.seqlen_new, hk, d, generator=gen).to(dtype).to(device)
        v_new = torch.randn(case.batch, case.seqlen_new, hk, d, generator=gen).to(dtype).to(device)
    if case.rotary_dim:
        angle = torch.rand(case.capacity + case.seqlen_q, case.rotary_dim // 2, generator=gen) * 2 * math.pi
        cos, sin = torch.cos(angle).to(dtype).to(device), torch.sin(angle).to(dtype).to(device)
    if case.alibi:
        shape = (case.nheads,) if case.alibi == "head" else (case.batch, case.nheads)
        slopes = torch.rand(*shape, generator=gen).to(device)
    seqlens = torch.tensor(case.seqlens, dtype=torch.int32, device=device)
    before_k, before_v = cache.k.clone(), cache.v.clone()
    kwargs = {}
    if case.page_size is not None:
        kwargs["block_table"] = cache.table.to(torch.int32).to(device)
    elif case.batch_idx:
        kwargs["cache_batch_idx"] = cache.entry.to(torch.int32).to(device)
    if case.leftpad is not None:
        kwargs["cache_leftpad"] = torch.tensor(case.leftpad, dtype=torch.int32, device=device)

    out, lse = flashtile.flash_attn_with_kvcache(
        q, cache.k, cache.v, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
        cache_seqlens=case.seqlens[0] if case.seqlens_as_int else seqlens, softmax_scale=case.softmax_scale,
        causal=case.causal, window_size=case.window, softcap=case.softcap,
        rotary_interleaved=case.rotary_interleaved, alibi_slopes=slopes, num_splits=case.num_splits,
        return_softmax_lse=True, **kwargs)

    # The cache: the new keys (rotated) at their positions, bit for bit; nothing else moved.
    expected_k, expected_v = before_k, before_v
    if case.seqlen_new:
        k_rot = k_new if not case.rotary_dim else apply_rotary_emb(k_new, cos, sin, case.rotary_interleaved,
                                                                     seqlen_offsets=seqlens)
        for b in range(case.batch):
            index = cache.index(b, torch.arange(case.seqlens[b], case.seqlens[b] + case.seqlen_new))
            expected_k[index], expected_v[index] = k_rot[b], v_new[b]
    for name, got, want in (("k_cache", cache.k, expected_k), ("v_cache", cache.v, expected_v)):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"{name}: rows other than the new keys' changed, or the new keys differ"

    # out and lse of each sequence against float64 attention over its keys.
    q_rot = q
    if case.rotary_dim:
        if case.causal or case.window[0] >= 0 or case.window[1] >= 0:
            q_rot = apply_rotary_emb(q, cos, sin, case.rotary_interleaved, seqlen_offsets=seqlens)
        else:  # every query at the position of the first new key
            q_rot = apply_rotary_emb(q.reshape(case.batch, 1, -1, d), cos, sin, case.rotary_interleaved,
                                     seqlen_offsets=seqlens).reshape(q.shape)
    for b in range(case.batch):
        lo = 0 if case.leftpad is None else case.leftpad[b]
        hi = case.seqlens[b] + case.seqlen_new
        keys, values = cache.rows(cache.k, b)[lo:hi], cache.rows(cache.v, b)[lo:hi]
        b_slopes = None if slopes is None else (slopes if slopes.dim() == 1 else slopes[b])
        args = dict(causal=case.causal, softmax_scale=case.softmax_scale, window_size=case.window,
                    softcap=case.softcap, alibi_slopes=b_slopes)
        ref, ref_lse = attention_ref(q_rot[b:b + 1].double(), keys[None].double(), values[None].double(), **args)
        pt, pt_lse = attention_ref(q_rot[b:b + 1], keys[None], values[None], upcast=False, **args)
        assert_close_fa_rule(out[b:b + 1], ref, pt, f"out of sequence {b}")
        finite = ref_lse.isfinite()
        slack = LSE_SLACK * max(1.0, ref_lse[finite].abs().max().item() if finite.any() else 1.0)
        assert_close_fa_rule(lse[b:b + 1], ref_lse, pt_lse.double(), f"lse of sequence {b}", atol=slack)


def built_kvcache() -> set:
    from flashtile import _C
    return set(tuple(entry) for entry in _C.built_kvcache_kernels())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--replay", type=int, help="rerun the case of this seed and print it")
    parser.add_argument("--time-limit", type=float, default=0.0, help="seconds after which no case starts (0: none)")
    parser.add_argument("--summary", help="write the summary here")
    parser.add_argument("--commit", help="the commit the summary names (default: git's HEAD here)")
    args = parser.parse_args(argv)
    built = built_kvcache()
    if args.replay is not None:
        case = draw_case(args.replay, built)
        print(json.dumps(dataclasses.asdict(case)))
        run_case(case)
        print("passed")
        return 0
    start, failures, ran = time.time(), [], 0
    for i in range(args.cases):
        if args.time_limit and time.time() - start > args.time_limit:
            break
        case = draw_case(args.seed * 1_000_003 + i, built)
        ran += 1
        try:
            run_case(case)
        except Exception as exc:  # noqa: BLE001 - every failure is recorded with its case
            failures.append(f"FAILED seed {case.seed}: {type(exc).__name__}: {exc}\n"
                            f"{json.dumps(dataclasses.asdict(case))}\n{traceback.format_exc(limit=3)}")
    lines = [f"# flashtile KV-cache fuzz (tests/fuzz_kvcache.py), long tier: {_provenance(args.commit)}",
             "# command: python tests/fuzz_kvcache.py " + " ".join(sys.argv[1:] if argv is None else argv),
             f"cases: {ran} of {args.cases}  seed: {args.seed}  failures: {len(failures)}  "
             f"seconds: {time.time() - start:.0f}"]
    text = "\n".join(lines + failures) + "\n"
    print(text)
    if args.summary:
        with open(args.summary, "w") as f:
            f.write(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
