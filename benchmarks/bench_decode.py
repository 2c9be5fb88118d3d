#!/usr/bin/env python3
"""Decode throughput: one new query token per sequence against a long KV
cache, flashtile.flash_attn_with_kvcache beside SDPA's backends, with the
GPU's copy bandwidth measured in the same process as the ceiling.

Decoding reads the whole cache once per step and does little math on it, so
the figure that matters is bandwidth: gbps = bytes of K, V and Q read and of
O written, over the time. copy_gbps is a device-to-device copy of a large
tensor (bytes read + written, over the time), the bound a kernel that only
streams memory reaches.

Cases: bf16, head dim 128, 32 query heads sharing 8 KV heads (GQA 4),
seqlen_q 1, batch 1, 8, 64, 256, context 1k to 128k tokens, where batch ·
context is at most MAX_TOKENS (the cache, twice for SDPA's layout, must fit
the GPU; half that on an 80 GB GPU). flashtile reads the cache three ways: dense (batch, context,
nheads_k, d); paged with pages of 16 and of 256 tokens, the same memory as a
pool of pages handed out in a random order by a block_table (so the reads
jump between pages as a serving engine's do). SDPA (cuDNN and flash
backends, enable_gqa) reads a dense (batch, nheads_k, context, d) copy, its
own layout.

Check before timing: each implementation's output for the first and the last
sequence is compared with attention in float32 over that sequence's keys,
with FlashAttention's bar (error <= 2 x PyTorch's own bf16 error + 1e-5); a
wrong result gets no time and exit status 1. Timing: each implementation's
call captured in a CUDA graph (serving engines replay their decode steps
that way, so the host's time per call is not the GPU's), CUDA events around
each replay, a buffer larger than L2 zeroed before each, median of the
repeats.

    python3 benchmarks/bench_decode.py                  # the sweep -> results CSV
    python3 benchmarks/bench_decode.py --quick          # a few cases, prints only
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HDIM, NHEADS, NHEADS_K = 128, 32, 8
BATCHES = (1, 8, 64, 256)
CONTEXTS = (1024, 4096, 16384, 65536, 131072)
PAGE_SIZES = (16, 256)
MAX_TOKENS = 8 * 1024 * 1024  # batch · context: 32 GiB of K and V at d128, 8 KV heads


def max_tokens() -> int:
    """MAX_TOKENS, halved until K, V and SDPA's copies of them take at most
    70 % of the GPU's memory: 8M tokens (64 GiB) on the H200, 4M on an 80 GB
    H100, where 8M ran out of memory in SDPA's copy."""
    bytes_per_token = 4 * NHEADS_K * HDIM * 2
    limit, memory = MAX_TOKENS, torch.cuda.get_device_properties(0).total_memory
    while limit * bytes_per_token > 0.7 * memory:
        limit //= 2
    return limit
L2_FLUSH_BYTES = 512 * 1024 * 1024
REPS = 30
COLUMNS = ["impl", "dtype", "hdim", "nheads", "nheads_k", "batch", "seqlen_q", "context", "page_size",
           "num_splits", "us", "gbps", "copy_gbps"]


def time_us(fn, flush, reps=REPS, graph=True) -> float:
    """Median microseconds of one call on the GPU. With graph, the call is
    captured in a CUDA graph and the replays are timed, as a serving engine
    runs its decode steps: the GPU's time, not the host's."""
    fn()
    torch.cuda.synchronize()
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            fn()
        run = captured.replay
    else:
        run = fn
    run()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        flush.zero_()
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return 1000 * statistics.median(s.elapsed_time(e) for s, e in events)


def copy_gbps(flush) -> float:
    """Device-to-device copy of 2 GiB: bytes read + written over the time."""
    src = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    us = time_us(lambda: dst.copy_(src), flush, reps=20, graph=False)
    return 2 * src.numel() * src.element_size() / (us * 1e3)


def fa_rule_error(out, q, keys, values):
    """(error, bound): out (1, 1, nheads, d) against float32 attention over
    keys, values (1, context, nheads_k, d); bound = 2 x bf16 PyTorch's error."""
    def attend(dtype):
        qq = q.to(dtype).transpose(1, 2)
        kk = keys.to(dtype).transpose(1, 2).repeat_interleave(NHEADS // NHEADS_K, dim=1)
        vv = values.to(dtype).transpose(1, 2).repeat_interleave(NHEADS // NHEADS_K, dim=1)
        scores = (qq @ kk.transpose(-1, -2)) * HDIM ** -0.5
        return (scores.softmax(-1) @ vv).transpose(1, 2)
    ref = attend(torch.float32)
    bound = 2 * (attend(torch.bfloat16).float() - ref).abs().max().item() + 1e-5
    return (out.float() - ref).abs().max().item(), bound


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batch 1 and 64, contexts 4k and 64k; no CSV")
    parser.add_argument("--commit", help="commit for the CSV header when the tree has no git "
                                         "(default: git rev-parse HEAD, else 'unknown')")
    parser.add_argument("--out", type=Path, default=None,
                        help="results CSV (default $FLASHTILE_RESULTS_DIR or ~/flashtile-results, h200-decode.csv)")
    args = parser.parse_args(argv)

    import flashtile
    from bench_attention import run_metadata  # the CSV's first line, as the main job's
    from plot_results import results_dir, write_table

    meta = run_metadata(args)
    print(", ".join(f"{key}={value}" for key, value in meta.items()))

    torch.manual_seed(0)
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    ceiling = copy_gbps(flush)
    print(f"{torch.cuda.get_device_name()}: device-to-device copy {ceiling:.0f} GB/s", flush=True)
    batches, contexts = ((1, 64), (4096, 65536)) if args.quick else (BATCHES, CONTEXTS)
    rows, failed = [], False
    token_limit = max_tokens()
    if token_limit < MAX_TOKENS:
        print(f"batch · context above {token_limit} left out: the caches would not fit this GPU")
    print(f"{'impl':<16}{'batch':>6}{'context':>9}{'page':>6}{'splits':>7}{'us':>10}{'GB/s':>8}{'of copy':>9}")
    for batch in batches:
        for context in contexts:
            if batch * context > token_limit:
                continue
            dtype = torch.bfloat16
            q = torch.randn(batch, 1, NHEADS, HDIM, device="cuda", dtype=dtype)
            k_cache = torch.randn(batch, context, NHEADS_K, HDIM, device="cuda", dtype=dtype)
            v_cache = torch.randn_like(k_cache)
            bytes_moved = 2 * k_cache.numel() * 2 + 2 * q.numel() * 2
            splits = {layout: flashtile._C.kvcache_plan(batch, 1, NHEADS, NHEADS_K, HDIM, context, 0,
                                                        0 if layout == "dense" else layout)[0]
                      for layout in ("dense",) + PAGE_SIZES}
            cases = {("flashtile", "dense"): lambda: flashtile.flash_attn_with_kvcache(q, k_cache, v_cache)}
            views = {}
            for page in PAGE_SIZES:
                pages = batch * context // page
                table = torch.randperm(pages, device="cuda", dtype=torch.int32).reshape(batch, -1)
                k_pages = k_cache.view(pages, page, NHEADS_K, HDIM)
                v_pages = v_cache.view(pages, page, NHEADS_K, HDIM)
                cases[("flashtile", page)] = (lambda kp=k_pages, vp=v_pages, t=table:
                                              flashtile.flash_attn_with_kvcache(q, kp, vp, block_table=t))
                views[page] = (table, k_pages, v_pages)
            k_sdpa = k_cache.transpose(1, 2).contiguous()
            v_sdpa = v_cache.transpose(1, 2).contiguous()
            q_sdpa = q.transpose(1, 2)
            for backend, name in ((torch.nn.attention.SDPBackend.CUDNN_ATTENTION, "sdpa_cudnn"),
                                  (torch.nn.attention.SDPBackend.FLASH_ATTENTION, "sdpa_flash")):
                def run(backend=backend):
                    with torch.nn.attention.sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q_sdpa, k_sdpa, v_sdpa, enable_gqa=True).transpose(1, 2)
                cases[(name, "dense")] = run

            for (impl, layout), fn in cases.items():
                try:
                    out = fn()
                except RuntimeError as exc:  # a backend that refuses the shapes
                    print(f"{impl:<16}{batch:>6}{context:>9}{str(layout):>6}  skipped: {str(exc).splitlines()[0]}")
                    continue
                for b in (0, batch - 1):
                    if layout == "dense":
                        keys, values = k_cache[b:b + 1], v_cache[b:b + 1]
                    else:
                        table, k_pages, v_pages = views[layout]
                        keys = k_pages[table[b].long()].reshape(1, context, NHEADS_K, HDIM)
                        values = v_pages[table[b].long()].reshape(1, context, NHEADS_K, HDIM)
                    err, bound = fa_rule_error(out[b:b + 1], q[b:b + 1], keys, values)
                    if not err <= bound:
                        print(f"{impl:<16}{batch:>6}{context:>9}{str(layout):>6}  FAIL: sequence {b} error "
                              f"{err:.2e} > {bound:.2e}")
                        failed = True
                        break
                else:
                    us = time_us(fn, flush)
                    gbps = bytes_moved / (us * 1e3)
                    page_size = 0 if layout == "dense" else layout
                    n_splits = splits[layout] if impl == "flashtile" else 0
                    print(f"{impl:<16}{batch:>6}{context:>9}{page_size:>6}{n_splits:>7}{us:>10.1f}{gbps:>8.0f}"
                          f"{gbps / ceiling:>9.2f}", flush=True)
                    rows.append(dict(impl=impl, dtype="bf16", hdim=HDIM, nheads=NHEADS, nheads_k=NHEADS_K,
                                     batch=batch, seqlen_q=1, context=context, page_size=page_size,
                                     num_splits=n_splits, us=f"{us:.2f}", gbps=f"{gbps:.1f}",
                                     copy_gbps=f"{ceiling:.1f}"))
            del cases, views, k_cache, v_cache, k_sdpa, v_sdpa
            torch.cuda.empty_cache()

    if not args.quick:
        out_path = args.out or results_dir() / "h200-decode.csv"
        write_table(out_path, meta, COLUMNS, rows)
        print(f"wrote {out_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
