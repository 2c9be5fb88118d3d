"""Ring attention's scaling across the GPUs of one host (issue 27).

    torchrun --nproc_per_node N benchmarks/bench_ring.py [--seqlens 32768 131072 ...]

For each total sequence length: forward + backward of
flashtile.distributed.ring_flash_attn_func on each rank's zigzag slice
(bf16, batch 1, d128, 32 query heads on 8 KV heads by default), the slowest
rank's time, beside single-GPU flashtile on the whole sequence (rank 0 alone,
the others waiting). Scaling efficiency = T_1 / (N · T_N). Before timing, each
length's ring output is gathered and checked against the single-GPU output.
Rank 0 writes the CSV (default $FLASHTILE_RESULTS_DIR or
~/flashtile-results, h200-x<N>-ring.csv).
"""

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

COLUMNS = ["impl", "world_size", "seqlen", "causal", "hdim", "nheads", "nheads_k", "ms", "tflops_per_gpu",
           "efficiency"]
# Largest |ring − single GPU| accepted before timing: bf16 outputs of order 1,
# merged in fp32 from bf16 partials.
MAX_DIFF = 0.05


def median_ms(step, together: bool) -> float:
    """The median time of `step` on this rank (bench_transformers.timed_steps);
    together: every rank starts each run at once (a barrier, untimed)."""
    from bench_transformers import timed_steps

    def barrier():
        dist.barrier()
        torch.cuda.synchronize()

    return statistics.median(timed_steps(step, before=barrier if together else None))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[32768, 131072],
                        help="total tokens (default 32768 131072; 524288 takes minutes a step on one GPU)")
    parser.add_argument("--hdim", type=int, default=128)
    parser.add_argument("--nheads", type=int, default=32)
    parser.add_argument("--nheads-k", type=int, default=8)
    parser.add_argument("--causal", type=int, nargs="+", choices=[0, 1], default=[1, 0])
    parser.add_argument("--commit", help="commit for the CSV header when the tree has no git")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    from bench_attention import DIRECTION_FLOPS, run_metadata
    from plot_results import results_dir, write_table

    import flashtile
    from flashtile import distributed

    dist.init_process_group("nccl")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    meta = run_metadata(args)
    rows, failed = [], False
    for causal in args.causal:
        for seqlen in args.seqlens:
            gen = torch.Generator(device="cuda").manual_seed(seqlen)
            shape = (1, seqlen, args.nheads, args.hdim)
            q = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
            k, v = (torch.randn(1, seqlen, args.nheads_k, args.hdim, device="cuda", dtype=torch.bfloat16,
                                generator=gen) for _ in range(2))
            dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
            local = [distributed.zigzag_split(t, world_size, rank).requires_grad_() for t in (q, k, v)]
            local_dout = distributed.zigzag_split(dout, world_size, rank)

            def ring_step():
                out = distributed.ring_flash_attn_func(*local, causal=bool(causal))
                torch.autograd.grad(out, local, local_dout)

            # The check: the whole ring output against one GPU's.
            with torch.no_grad():
                out = distributed.ring_flash_attn_func(*local, causal=bool(causal))
            slices = [torch.empty_like(out) for _ in range(world_size)]
            dist.all_gather(slices, out.contiguous())
            single = flashtile.flash_attn_func(q, k, v, causal=bool(causal)) if rank == 0 else None
            diff = torch.tensor(0.0, device="cuda")
            if rank == 0:
                diff.fill_((distributed.zigzag_unsplit(slices).float() - single.float()).abs().max())
            dist.broadcast(diff, 0)
            if not diff.item() <= MAX_DIFF:
                if rank == 0:
                    print(f"seqlen {seqlen} causal {causal}: FAIL, max |ring - single GPU| = {diff.item():.4f}")
                failed = True
                continue

            ring_ms = torch.tensor(median_ms(ring_step, together=True), device="cuda")
            dist.all_reduce(ring_ms, op=dist.ReduceOp.MAX)  # the slowest rank's
            single_ms = torch.tensor(0.0, device="cuda")
            dist.barrier()
            if rank == 0:
                whole = [t.detach().requires_grad_() for t in (q, k, v)]

                def single_step():
                    out = flashtile.flash_attn_func(*whole, causal=bool(causal))
                    torch.autograd.grad(out, whole, dout)

                single_ms.fill_(median_ms(single_step, together=False))
            dist.barrier()
            dist.broadcast(single_ms, 0)
            flops = 4 * args.nheads * seqlen * seqlen * args.hdim * DIRECTION_FLOPS["fwdbwd"] / (2 if causal else 1)
            efficiency = single_ms.item() / (world_size * ring_ms.item())
            for impl, ms, gpus in (("flashtile", single_ms.item(), 1), ("flashtile_ring", ring_ms.item(), world_size)):
                rows.append(dict(impl=impl, world_size=gpus, seqlen=seqlen, causal=causal, hdim=args.hdim,
                                 nheads=args.nheads, nheads_k=args.nheads_k, ms=f"{ms:.3f}",
                                 tflops_per_gpu=f"{flops / (ms * 1e-3) / gpus / 1e12:.1f}",
                                 efficiency=f"{efficiency:.3f}" if gpus > 1 else "1.000"))
            if rank == 0:
                print(f"seqlen {seqlen:>7} causal {causal}: 1 GPU {single_ms.item():9.2f} ms, {world_size} GPUs "
                      f"{ring_ms.item():9.2f} ms, efficiency {efficiency:.3f}", flush=True)
            del local, local_dout, q, k, v, dout
            torch.cuda.empty_cache()
    if rank == 0:
        out_path = args.out or results_dir() / f"h200-x{world_size}-ring.csv"
        write_table(out_path, meta, COLUMNS, rows)
        print(f"wrote {out_path}")
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
