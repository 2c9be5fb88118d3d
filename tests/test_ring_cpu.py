"""The ring's schedule and merges (flashtile.distributed), on the CPU: the
kernels replaced by a float64 stand-in (the forward's out and lse, and the
backward from the whole ring's out and lse, as the kernels compute them), so
that N virtual ranks, and ring_flash_attn_func across gloo processes, must
reproduce dense attention over the whole sequence to float64 rounding.
test_ring_gpu.py runs the virtual ranks with the kernels."""

import pytest
import torch

from flashtile import distributed
from reference import attention_ref, attention_ref_backward, varlen_attention_ref, window_mask


class StandInKernels:
    """float64 attention with the kernels' contracts: fwd -> (out, lse);
    bwd(dout, q, k, v, out, lse) -> (dq, dk, dv) recomputing P from lse and
    taking D = rowsum(dout * out), with dk, dv summed over a GQA group. With
    the kernels' varlen arguments (batch 1, packed rows) each sequence on its
    own, its keys up to seqused_k (the others get dk = dv = 0)."""

    @staticmethod
    def fwd(q, k, v, softmax_scale, window, varlen):
        if varlen is None:
            return attention_ref(q, k, v, softmax_scale=softmax_scale, window_size=window)
        outs, lses = [], []
        for qs, ks in StandInKernels.sequences(varlen):
            out, lse = attention_ref(q[:, qs], k[:, ks], v[:, ks], softmax_scale=softmax_scale, window_size=window)
            outs.append(out)
            lses.append(lse)
        return torch.cat(outs, dim=1), torch.cat(lses, dim=2)

    @staticmethod
    def bwd(dout, q, k, v, out, lse, softmax_scale, window, varlen):
        if varlen is None:
            return StandInKernels.dense_bwd(dout, q, k, v, out, lse, softmax_scale, window)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for qs, ks in StandInKernels.sequences(varlen):
            dq[:, qs], dk[:, ks], dv[:, ks] = StandInKernels.dense_bwd(
                dout[:, qs], q[:, qs], k[:, ks], v[:, ks], out[:, qs], lse[:, :, qs], softmax_scale, window)
        return dq, dk, dv

    @staticmethod
    def sequences(varlen):
        """Each sequence's (query rows, attended key rows)."""
        cu_q, cu_k = varlen["cu_seqlens_q"].tolist(), varlen["cu_seqlens_k"].tolist()
        used = varlen["seqused_k"]
        for b in range(len(cu_q) - 1):
            keys = cu_k[b + 1] - cu_k[b] if used is None else int(used[b])
            yield slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b] + keys)

    @staticmethod
    def dense_bwd(dout, q, k, v, out, lse, softmax_scale, window):
        group = q.shape[2] // k.shape[2]
        ke, ve = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, ke) * softmax_scale
        scores = scores.masked_fill(window_mask(q.shape[1], k.shape[1], window, q.device), float("-inf"))
        p = torch.exp(scores - lse.unsqueeze(-1))
        dp = torch.einsum("bqhd,bkhd->bhqk", dout, ve)
        d = (dout * out).sum(-1).transpose(1, 2).unsqueeze(-1)  # (b, h, q, 1)
        ds = torch.where(torch.isneginf(scores), 0.0, p * (dp - d))  # rows that see no key: P 0
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


# Sliding windows over the whole sequence, (left, right) with causal: a
# window inside one chunk, across chunks, one side only, wider than the
# sequence, and the empty-looking (0, 0) (each query sees its own key).
WINDOWS = [((3, 2), False), ((0, 0), False), ((7, -1), False), ((-1, 5), False), ((100, 100), False),
           ((4, 0), True), ((13, -1), True)]


@pytest.mark.parametrize("window, causal", WINDOWS, ids=[f"{w[0]}_{w[1]}{'_causal' if c else ''}" for w, c in WINDOWS])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_simulated_ring_with_a_window_is_dense_attention(stand_in, world_size, window, causal):
    torch.manual_seed(world_size * 10 + window[0])
    seqlen = 2 * world_size * 5
    q, k, v = rand(2, seqlen, 4, 16), rand(2, seqlen, 2, 16), rand(2, seqlen, 2, 16)
    dout = torch.randn(2, seqlen, 4, 16, dtype=torch.float64)
    out, lse = distributed.simulate_ring_flash_attn(q, k, v, world_size, softmax_scale=0.3, causal=causal,
                                                    window_size=window)
    ref_out, ref_lse = attention_ref(q, k, v, causal=causal, softmax_scale=0.3, window_size=window)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-10, atol=1e-10)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    _, ref_grads = attention_ref_backward(q.detach(), k.detach(), v.detach(), dout, causal=causal, softmax_scale=0.3,
                                          window_size=window)
    for name, g, r in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-9, msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)), (False, (3, 2)), (True, (7, 0))],
                         ids=["full", "causal", "window_3_2", "window_7_causal"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_simulated_varlen_ring_is_dense_attention(stand_in, world_size, causal, window):
    """A packed batch of sequences of different lengths, each zigzag-split on
    its own: the ring's output, lse and gradients are each sequence's dense
    attention (with a window, within each sequence)."""
    torch.manual_seed(world_size + 10 * causal)
    lengths = [2 * world_size * n for n in (3, 1, 5)]
    cu_seqlens = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))], dtype=torch.int32)
    total = int(cu_seqlens[-1])
    q, k, v = rand(total, 4, 16), rand(total, 2, 16), rand(total, 2, 16)
    dout = torch.randn(total, 4, 16, dtype=torch.float64)
    out, lse = distributed.simulate_ring_flash_attn_varlen(q, k, v, cu_seqlens, max(lengths), world_size,
                                                           softmax_scale=0.3, causal=causal, window_size=window)
    ref_out, ref_lse, ref_grads = varlen_attention_ref(q, k, v, dout, cu_seqlens, causal, 0.3, window_size=window)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-10, atol=1e-10)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for name, g, r in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-9, msg=lambda m, name=name: f"d{name}: {m}")


def test_zigzag_varlen_split_and_unsplit():
    cu_seqlens = torch.tensor([0, 8, 12], dtype=torch.int32)
    x = torch.arange(12).view(12, 1)
    slices = [distributed.zigzag_split_varlen(x, cu_seqlens, 2, r) for r in range(2)]
    # Sequence 0 in chunks of 2 (rank 0: chunks 0 and 3), sequence 1 in chunks of 1.
    assert slices[0].flatten().tolist() == [0, 1, 6, 7, 8, 11]
    assert slices[1].flatten().tolist() == [2, 3, 4, 5, 9, 10]
    assert distributed.zigzag_cu_seqlens(cu_seqlens, 2).tolist() == [0, 4, 6]
    assert torch.equal(distributed.zigzag_unsplit_varlen(slices, cu_seqlens), x)
    with pytest.raises(ValueError, match="cu_seqlens: sequence 1"):
        distributed.zigzag_cu_seqlens(torch.tensor([0, 8, 11], dtype=torch.int32), 2)


def test_window_skips_the_steps_it_does_not_reach():
    """With a window shorter than a chunk, a rank's steps against keys two
    or more chunks away run no kernel: of 8 ranks' 8 steps, only those whose
    chunks touch ours (the same or a neighbouring chunk) have blocks."""
    world_size, seqlen = 8, 2 * 16
    steps = sum(bool(distributed._step_blocks(r, s, seqlen, world_size, (3, 3)))
                for r in range(world_size) for s in range(world_size))
    # Chunk c's neighbours c - 1 and c + 1; the two middle chunks (7, 8) are rank 7's.
    assert steps == 3 * world_size - 2, steps


def test_band_blocks_keep_only_what_the_window_lets_through():
    # Queries 10..14 against keys 0..4, left 7, causal: rows 10 and 11 see keys
    # from 3 and 4; as a 2 x 2 block at rows 10, keys 3: window (0, 7).
    assert distributed._band_block(10, 5, 0, 5, (7, 0)) == (0, 2, 3, 2, (0, 7))
    assert distributed._band_block(10, 5, 0, 5, (2, 0)) is None
    assert distributed._band_block(0, 5, 10, 5, (-1, 0)) is None


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


def _ring_rank_varlen(rank, world_size, init_file, out_dir, causal):
    """One gloo rank of test_varlen_ring_over_gloo_is_dense_attention."""
    import torch.distributed as dist
    distributed._KERNELS = StandInKernels
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    q, k, v, dout, cu_seqlens, max_seqlen = torch.load(f"{out_dir}/inputs.pt")
    local = [distributed.zigzag_split_varlen(t, cu_seqlens, world_size, rank).requires_grad_() for t in (q, k, v)]
    out, lse = distributed.ring_flash_attn_varlen_func(*local, distributed.zigzag_cu_seqlens(cu_seqlens, world_size),
                                                       max_seqlen // world_size, softmax_scale=0.3, causal=causal,
                                                       return_lse=True)
    grads = torch.autograd.grad(out, local, distributed.zigzag_split_varlen(dout, cu_seqlens, world_size, rank))
    torch.save([out.detach(), lse, *grads], f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_ring_over_gloo_is_dense_attention(tmp_path, causal):
    """ring_flash_attn_varlen_func across 2 gloo processes (the stand-in
    kernels): each sequence's rows put together are its dense attention."""
    torch.manual_seed(8)
    world_size, lengths = 2, [12, 4, 20]
    cu_seqlens = torch.tensor([0, 12, 16, 36], dtype=torch.int32)
    q, k, v = (torch.randn(36, h, 8, dtype=torch.float64) for h in (4, 2, 2))
    dout = torch.randn(36, 4, 8, dtype=torch.float64)
    torch.save([q, k, v, dout, cu_seqlens, max(lengths)], tmp_path / "inputs.pt")
    torch.multiprocessing.spawn(_ring_rank_varlen, args=(world_size, str(tmp_path / "init"), str(tmp_path), causal),
                                nprocs=world_size)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)]
    out, dq, dk, dv = (distributed.zigzag_unsplit_varlen([r[i] for r in results], cu_seqlens) for i in (0, 2, 3, 4))
    lse = distributed.zigzag_unsplit_varlen([r[1] for r in results], cu_seqlens, dim=1)
    ref_out, ref_lse, ref_grads = varlen_attention_ref(q, k, v, dout, cu_seqlens, causal, 0.3)
    for name, got, ref in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, dq, dk, dv),
                              (ref_out, ref_lse, *ref_grads)):
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
            for q_rows, k_rows, window, _ in distributed._step_blocks(rank, (rank - step) % world_size, seqlen,
                                                                   world_size, distributed.CAUSAL):
                nq, nk = q_rows.stop - q_rows.start, k_rows.stop - k_rows.start
                causal = window == distributed.CAUSAL
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


def test_varlen_inputs_name_the_function_that_takes_them():
    q = torch.zeros(12, 2, 8)
    with pytest.raises(ValueError, match="varlen"):
        distributed.simulate_ring_flash_attn(q, q, q, 2)


def test_varlen_window_blocks_are_each_sequences():
    """With a window, a varlen step's blocks are each sequence's fixed-length
    blocks, at its rows."""
    varlen = distributed._Varlen(torch.tensor([0, 8, 12], dtype=torch.int32), 8)
    blocks = distributed._step_blocks(0, 0, 12, 2, (1, 1), varlen)
    expected = [b[:3] for b in distributed._step_blocks(0, 0, 8, 2, (1, 1))]
    expected += [(slice(q.start + 8, q.stop + 8), slice(k.start + 8, k.stop + 8), w)
                 for q, k, w, _ in distributed._step_blocks(0, 0, 4, 2, (1, 1))]
    assert [b[:3] for b in blocks] == expected and all(b[3] is None for b in blocks)


def test_ring_needs_an_initialized_process_group():
    x = torch.zeros(1, 4, 2, 8)
    with pytest.raises(RuntimeError, match="init_process_group"):
        distributed.ring_flash_attn_func(x, x, x)
