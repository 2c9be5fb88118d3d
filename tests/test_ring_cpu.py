"""The ring's schedule and merges (flashtile.distributed), on the CPU: the
kernels replaced by a float64 stand-in (the forward's out and lse, and the
backward from the whole ring's out and lse, as the kernels compute them), so
that N virtual ranks, and ring_flash_attn_func across gloo processes, must
reproduce dense attention over the whole sequence to float64 rounding.
test_ring_gpu.py runs the virtual ranks with the kernels."""

import pytest
import torch

from flashtile import distributed
from reference import attention_ref, attention_ref_backward, causal_mask


class StandInKernels:
    """float64 attention with the kernels' contracts: fwd -> (out, lse);
    bwd(dout, q, k, v, out, lse) -> (dq, dk, dv) recomputing P from lse and
    taking D = rowsum(dout * out), with dk, dv summed over a GQA group."""

    @staticmethod
    def fwd(q, k, v, softmax_scale, causal):
        return attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale)

    @staticmethod
    def bwd(dout, q, k, v, out, lse, softmax_scale, causal):
        group = q.shape[2] // k.shape[2]
        ke, ve = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, ke) * softmax_scale
        if causal:
            scores = scores.masked_fill(causal_mask(q.shape[1], k.shape[1], q.device), float("-inf"))
        p = torch.exp(scores - lse.unsqueeze(-1))
        dp = torch.einsum("bqhd,bkhd->bhqk", dout, ve)
        d = (dout * out).sum(-1).transpose(1, 2).unsqueeze(-1)  # (b, h, q, 1)
        ds = p * (dp - d)
        dq = torch.einsum("bhqk,bkhd->bqhd", ds, ke) * softmax_scale
        dk = torch.einsum("bhqk,bqhd->bkhd", ds, q) * softmax_scale
        dv = torch.einsum("bhqk,bqhd->bkhd", p, dout)
        b, s, hk, dim = k.shape
        return dq, dk.view(b, s, hk, group, dim).sum(3), dv.view(b, s, hk, group, dim).sum(3)


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(distributed, "_KERNELS", StandInKernels)


def rand(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("nheads, nheads_k", [(4, 4), (4, 2), (3, 1)], ids=["mha", "gqa", "mqa"])
def test_simulated_ring_is_dense_attention(stand_in, world_size, causal, nheads, nheads_k):
    torch.manual_seed(world_size * 10 + causal)
    seqlen = 2 * world_size * 5
    q, k, v = rand(2, seqlen, nheads, 16), rand(2, seqlen, nheads_k, 16), rand(2, seqlen, nheads_k, 16)
    dout = torch.randn(2, seqlen, nheads, 16, dtype=torch.float64)
    out, lse = distributed.simulate_ring_flash_attn(q, k, v, world_size, softmax_scale=0.3, causal=causal)
    ref_out, ref_lse = attention_ref(q, k, v, causal=causal, softmax_scale=0.3)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-10, atol=1e-10)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    _, ref_grads = attention_ref_backward(q.detach(), k.detach(), v.detach(), dout, causal=causal, softmax_scale=0.3)
    for name, g, r in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-9, msg=lambda m, name=name: f"d{name}: {m}")


def _ring_rank(rank, world_size, init_file, out_dir, causal):
    """One gloo rank of test_ring_over_gloo_is_dense_attention: its slice of
    the shared inputs through ring_flash_attn_func, forward and backward."""
    import torch.distributed as dist
    distributed._KERNELS = StandInKernels
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    q, k, v, dout = torch.load(f"{out_dir}/inputs.pt")
    local = [distributed.zigzag_split(t, world_size, rank).requires_grad_() for t in (q, k, v)]
    out, lse = distributed.ring_flash_attn_func(*local, softmax_scale=0.3, causal=causal, return_lse=True)
    grads = torch.autograd.grad(out, local, distributed.zigzag_split(dout, world_size, rank))
    torch.save([out.detach(), lse, *grads], f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_ring_over_gloo_is_dense_attention(tmp_path, world_size, causal):
    """ring_flash_attn_func itself, across processes (gloo on the CPU, the
    stand-in kernels): the ranks' slices put together are dense attention."""
    torch.manual_seed(7)
    seqlen = 2 * world_size * 4
    q, k, v = (torch.randn(1, seqlen, h, 8, dtype=torch.float64) for h in (4, 2, 2))
    dout = torch.randn(1, seqlen, 4, 8, dtype=torch.float64)
    torch.save([q, k, v, dout], tmp_path / "inputs.pt")
    torch.multiprocessing.spawn(_ring_rank, args=(world_size, str(tmp_path / "init"), str(tmp_path), causal),
                                nprocs=world_size)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)]
    out, dq, dk, dv = (distributed.zigzag_unsplit([r[i] for r in results]) for i in (0, 2, 3, 4))
    lse = distributed.zigzag_unsplit([r[1] for r in results], dim=2)
    ref_out, ref_lse = attention_ref(q, k, v, causal=causal, softmax_scale=0.3)
    _, ref_grads = attention_ref_backward(q, k, v, dout, causal=causal, softmax_scale=0.3)
    expected = (ref_out, ref_lse, *ref_grads)
    for name, got, ref in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, dq, dk, dv), expected):
        torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9, msg=lambda m, name=name: f"{name}: {m}")


def test_zigzag_split_and_unsplit():
    x = torch.arange(24).view(1, 24)
    slices = [distributed.zigzag_split(x, 3, r) for r in range(3)]
    # Six chunks of 4: rank r holds chunks r and 5 - r.
    assert slices[0].tolist() == [[0, 1, 2, 3, 20, 21, 22, 23]]
    assert slices[2].tolist() == [[8, 9, 10, 11, 12, 13, 14, 15]]
    assert torch.equal(distributed.zigzag_unsplit(slices), x)


def test_each_rank_computes_as_many_pairs_causal():
    """The zigzag split's point: with causal attention every rank's steps
    cover the same number of visible (query, key) pairs."""
    world_size, seqlen = 4, 8  # a rank's slice: two chunks of 4 rows
    pairs = []
    for rank in range(world_size):
        total = 0
        for step in range(world_size):
            rows = distributed._step_slices(rank, (rank - step) % world_size, seqlen, True)
            if rows is not None:
                q_rows, k_rows, causal = rows
                nq, nk = q_rows.stop - q_rows.start, k_rows.stop - k_rows.start
                total += nq * (nk + 1) // 2 + nq * (nk - nq) // 2 if causal else nq * nk
        pairs.append(total)
    assert len(set(pairs)) == 1, pairs


@pytest.mark.parametrize("seqlen, world_size", [(10, 3), (7, 1)])
def test_uneven_split_names_the_argument(seqlen, world_size):
    x = torch.zeros(1, seqlen, 2, 8)
    with pytest.raises(ValueError, match="2 \\* world_size"):
        distributed.zigzag_split(x, world_size, 0)
    with pytest.raises(ValueError, match="q: the sequence length"):
        distributed.simulate_ring_flash_attn(x, x, x, world_size)


def test_varlen_inputs_are_refused():
    q = torch.zeros(12, 2, 8)
    with pytest.raises(ValueError, match="varlen"):
        distributed.simulate_ring_flash_attn(q, q, q, 2)


def test_ring_needs_an_initialized_process_group():
    x = torch.zeros(1, 4, 2, 8)
    with pytest.raises(RuntimeError, match="init_process_group"):
        distributed.ring_flash_attn_func(x, x, x)
