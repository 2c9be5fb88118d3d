"""Ring attention (flashtile.distributed) on one GPU: N virtual ranks
(simulate_ring_flash_attn) run the ring's schedule with flashtile's kernels,
and the whole sequence's output, lse and gradients must meet FlashAttention's
rule against the float64 reference, as single-GPU flashtile does. (The
schedule's exactness in float64: test_ring_cpu.py.)"""

import pytest
import torch

import flashtile
from flashtile import distributed
from reference import assert_close_fa_rule, attention_ref, attention_ref_backward, varlen_attention_ref
from test_backward_gpu import check_grads, rand_qkv, require_built

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
@pytest.mark.parametrize("nheads, nheads_k", [(4, 4), (4, 1)], ids=["mha", "mqa"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_simulated_ring_meets_the_rule(head_dim, nheads, nheads_k, world_size, causal):
    require_built(head_dim, torch.bfloat16)
    torch.manual_seed(world_size + 100 * causal)
    seqlen = 2 * world_size * 96
    q, k, v = rand_qkv(2, seqlen, seqlen, nheads, nheads_k, head_dim, torch.bfloat16)
    out, lse = distributed.simulate_ring_flash_attn(q, k, v, world_size, causal=causal)
    _, ref_lse = attention_ref(q, k, v, causal=causal)
    _, pt_lse = attention_ref(q, k, v, causal=causal, upcast=False)
    assert_close_fa_rule(lse, ref_lse, pt_lse, "lse")
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    check_grads(q, k, v, dout, out, grads, causal)
    # And beside single-GPU flashtile: the same rounding, a merge apart.
    single = flashtile.flash_attn_func(q, k, v, causal=causal)
    torch.testing.assert_close(out, single, rtol=0.02, atol=0.02)


@pytest.mark.parametrize("window, causal", [((100, 0), True), ((50, 70), False), ((-1, 30), False)],
                         ids=["left100_causal", "50_70", "right30"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_simulated_ring_with_a_window_meets_the_rule(world_size, window, causal):
    """Sliding windows across the zigzag chunks (96 rows each): the blocks
    the ring cuts from each pair of chunks, their windows shifted, against
    the float64 reference of the windowed attention."""
    require_built(128, torch.bfloat16)
    torch.manual_seed(world_size + window[0])
    seqlen = 2 * world_size * 96
    q, k, v = rand_qkv(1, seqlen, seqlen, 4, 2, 128, torch.bfloat16)
    out, lse = distributed.simulate_ring_flash_attn(q, k, v, world_size, causal=causal, window_size=window)
    _, ref_lse = attention_ref(q, k, v, causal=causal, window_size=window)
    _, pt_lse = attention_ref(q, k, v, causal=causal, window_size=window, upcast=False)
    assert_close_fa_rule(lse, ref_lse, pt_lse, "lse")
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_out, ref_grads = attention_ref_backward(q, k, v, dout, causal, window_size=window)
    pt_out, pt_grads = attention_ref_backward(q, k, v, dout, causal, window_size=window, upcast=False)
    assert_close_fa_rule(out, ref_out, pt_out, "out")
    for name, got, ref, pt in zip(("dq", "dk", "dv"), grads, ref_grads, pt_grads):
        assert_close_fa_rule(got, ref, pt, name)


@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)), (True, (100, 0))],
                         ids=["full", "causal", "window100_causal"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_simulated_varlen_ring_meets_the_rule(world_size, causal, window):
    """A packed batch of three sequences of different lengths, each
    zigzag-split on its own, through the varlen kernels (seqused_k for the
    source's first chunks, the gathered second chunks as queries; with a
    window, each sequence's blocks)."""
    require_built(128, torch.bfloat16)
    torch.manual_seed(world_size + 10 * causal)
    lengths = [2 * world_size * n for n in (40, 7, 96)]
    cu_seqlens = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(3)], dtype=torch.int32, device="cuda")
    total = sum(lengths)
    q, k, v = (torch.randn(total, h, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for h in (4, 2, 2))
    out, lse = distributed.simulate_ring_flash_attn_varlen(q, k, v, cu_seqlens, max(lengths), world_size,
                                                           causal=causal, window_size=window)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_out, ref_lse, ref_grads = varlen_attention_ref(q, k, v, dout, cu_seqlens, causal, window_size=window)
    pt_out, pt_lse, pt_grads = varlen_attention_ref(q, k, v, dout, cu_seqlens, causal, upcast=False,
                                                    window_size=window)
    assert_close_fa_rule(out, ref_out, pt_out, "out")
    assert_close_fa_rule(lse, ref_lse, pt_lse, "lse")
    for name, got, ref, pt in zip(("dq", "dk", "dv"), grads, ref_grads, pt_grads):
        assert_close_fa_rule(got, ref, pt, name)
