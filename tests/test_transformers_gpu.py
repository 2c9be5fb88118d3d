"""flashtile inside transformers models on the GPU (flashtile.integrations.
transformers): small random-weight Llama, Mistral (sliding window) and
Gemma 2 (softcap, alternating sliding windows) in bfloat16, padded batches,
against the same models in float32 with eager attention. FlashAttention's
rule, per model output: flashtile's error at most twice that of the same
model in bfloat16 with transformers' own attention (sdpa; eager for Gemma 2,
whose softcap sdpa refuses), plus a rounding of slack. The profiler names the
kernels that ran.
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)
transformers = pytest.importorskip("transformers", minversion="5.0")

import flashtile.integrations.transformers as ft_transformers  # noqa: E402
from kernel_names import cuda_kernel_names  # noqa: E402
from test_transformers_cpu import padded_batch, tiny_config  # noqa: E402

PEERS = {"llama": "sdpa", "mistral": "sdpa", "gemma2": "eager"}


def require_kernels(kind):
    """Skip unless the build has the kernels the tiny models run: head dim
    16 zero-padded to 32, bf16, forward and backward (Gemma 2's softcap: the
    scoremod variant)."""
    from flashtile import _C

    built = {(d, hd, dn, v) for d, arch, hd, dn, v in _C.built_kernels()}
    for direction in ("fwd", "bwd"):
        for variant in ("plain", "scoremod") if kind == "gemma2" else ("plain",):
            if (direction, 32, "bf16", variant) not in built:
                pytest.skip(f"this build has no {direction} kernel for head dim 32, bf16, {variant}")


def loss_and_grads(model, ids, mask):
    model.zero_grad()
    logits = model(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    logits[real].float().square().mean().backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits[real].float().detach(), grads


@pytest.mark.parametrize("kind", list(PEERS))
def test_models_match_float32_within_the_peers_error(kind):
    require_kernels(kind)
    name = ft_transformers.register()
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(tiny_config(kind), attn_implementation="eager").cuda()
    state = ref.state_dict()
    models = {}
    for impl in (name, PEERS[kind]):
        model = transformers.AutoModelForCausalLM.from_config(tiny_config(kind), attn_implementation=impl)
        model.load_state_dict(state)
        models[impl] = model.to("cuda", torch.bfloat16)
    ids, mask = padded_batch([40, 23, 1], 40, left=True)
    ids, mask = ids.cuda(), mask.cuda()
    want_logits, want_grads = loss_and_grads(ref, ids, mask)
    (ours_logits, ours_grads), names = cuda_kernel_names(lambda: loss_and_grads(models[name], ids, mask))
    peer_logits, peer_grads = loss_and_grads(models[PEERS[kind]], ids, mask)
    assert any("flashtile::" in n for n in names), names

    def check(what, ours, peer, want):
        ours_err = (ours - want).abs().max().item()
        peer_err = (peer - want).abs().max().item()
        slack = 2 ** -8 * want.abs().max().item()  # one bf16 rounding of the largest value
        assert ours_err <= 2 * peer_err + slack, f"{kind} {what}: {ours_err:.3g} > 2 x {peer_err:.3g} + {slack:.3g}"

    check("logits", ours_logits, peer_logits, want_logits)
    for n, grad in want_grads.items():
        check(f"grad {n}", ours_grads[n], peer_grads[n], grad)
