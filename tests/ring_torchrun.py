"""Ring attention across the GPUs of one host, exact against one GPU:

    torchrun --nproc_per_node N tests/ring_torchrun.py

Every rank makes the same whole-sequence q, k, v and dout (one seed), runs
flashtile.distributed.ring_flash_attn_func forward and backward on its
zigzag slice, and rank 0 gathers the slices and checks output and gradients
against the float64 reference by FlashAttention's rule (as the GPU suite
does for single-GPU flashtile), causal and not, MHA and GQA, and with a
sliding window; then ring_flash_attn_varlen_func on a packed batch of three
sequences. Exits non-zero on the first failure."""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import assert_close_fa_rule, attention_ref_backward, varlen_attention_ref  # noqa: E402

from flashtile import distributed  # noqa: E402


def gather_whole(local, world_size):
    """The whole sequence from every rank's slice, on every rank."""
    slices = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(slices, local.contiguous())
    return distributed.zigzag_unsplit(slices)


def check(case, whole, ref_out, ref_grads, pt_out, pt_grads):
    for name, got, ref, pt in zip(("out", "dq", "dk", "dv"), whole, (ref_out, *ref_grads), (pt_out, *pt_grads)):
        assert_close_fa_rule(got, ref, pt, f"{case}: {name}")
    print(f"ring ok: {case}", flush=True)


def main():
    dist.init_process_group("nccl")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    seqlen, head_dim = 2 * world_size * 128, 128
    for causal, window in ((False, (-1, -1)), (True, (-1, -1)), (True, (300, 0))):
        for nheads, nheads_k in ((8, 8), (8, 2)):
            gen = torch.Generator(device="cuda").manual_seed(1234)
            def rand(heads):
                return torch.randn(2, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
            q, k, v, dout = rand(nheads), rand(nheads_k), rand(nheads_k), rand(nheads)
            local = [distributed.zigzag_split(t, world_size, rank).requires_grad_() for t in (q, k, v)]
            out = distributed.ring_flash_attn_func(*local, causal=causal, window_size=window)
            grads = torch.autograd.grad(out, local, distributed.zigzag_split(dout, world_size, rank))
            whole = [gather_whole(t, world_size) for t in (out, *grads)]
            if rank == 0:
                ref_out, ref_grads = attention_ref_backward(q, k, v, dout, causal, window_size=window)
                pt_out, pt_grads = attention_ref_backward(q, k, v, dout, causal, window_size=window, upcast=False)
                check(f"world_size {world_size}, causal {causal}, window {window}, heads {nheads}/{nheads_k}",
                      whole, ref_out, ref_grads, pt_out, pt_grads)
    # A packed varlen batch, each sequence zigzag-split on its own.
    lengths = [2 * world_size * n for n in (64, 8, 200)]
    cu_seqlens = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(3)], dtype=torch.int32, device="cuda")
    local_cu = distributed.zigzag_cu_seqlens(cu_seqlens, world_size)
    for causal in (False, True):
        gen = torch.Generator(device="cuda").manual_seed(99)
        q, k, v, dout = (torch.randn(sum(lengths), h, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                         for h in (8, 2, 2, 8))
        local = [distributed.zigzag_split_varlen(t, cu_seqlens, world_size, rank).requires_grad_() for t in (q, k, v)]
        out = distributed.ring_flash_attn_varlen_func(*local, local_cu, max(lengths) // world_size, causal=causal)
        grads = torch.autograd.grad(out, local, distributed.zigzag_split_varlen(dout, cu_seqlens, world_size, rank))
        gathered = []
        for t in (out, *grads):
            slices = [torch.empty_like(t) for _ in range(world_size)]
            dist.all_gather(slices, t.contiguous())
            gathered.append(distributed.zigzag_unsplit_varlen(slices, cu_seqlens))
        if rank == 0:
            ref_out, _, ref_grads = varlen_attention_ref(q, k, v, dout, cu_seqlens, causal)
            pt_out, _, pt_grads = varlen_attention_ref(q, k, v, dout, cu_seqlens, causal, upcast=False)
            check(f"varlen world_size {world_size}, causal {causal}", gathered, ref_out, ref_grads, pt_out, pt_grads)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
