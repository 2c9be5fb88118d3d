"""Ring attention (flashtile.distributed) on one GPU: N virtual ranks
(simulate_ring_flash_attn) run the ring's schedule with flashtile's kernels,
and the whole sequence's output, lse and gradients must meet FlashAttention's
rule against the float64 reference, as single-GPU flashtile does. (The
schedule's exactness in float64: test_ring_cpu.py.)"""

import pytest
import torch

import flashtile
from flashtile import distributed
from reference import assert_close_fa_rule, attention_ref
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
