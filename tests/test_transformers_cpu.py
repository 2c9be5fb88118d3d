"""CPU tests of flashtile.integrations.transformers: the glue between
transformers' attention interface and flashtile's functions.

A reference attention (tests/reference.py, float32) stands in for the
kernels, so these check what the integration decides — names, layouts, the
padding mask unpadded to varlen and scattered back, decoding's queries as
the last keys, sliding windows, softcap, GQA, packed batches — by running
small random-weight Llama, Mistral and Gemma 2 models against transformers'
own eager attention. tests/test_transformers_gpu.py runs the same models on
the kernels.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5.0")

import flashtile.integrations.transformers as ft_transformers  # noqa: E402
from reference import attention_ref  # noqa: E402


def reference_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                   deterministic=False):
    assert dropout_p == 0.0
    return attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size,
                         softcap=softcap)[0].to(q.dtype)


def reference_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **options):
    assert isinstance(max_seqlen_q, int) and isinstance(max_seqlen_k, int)
    assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32
    outs = []
    for b in range(cu_seqlens_q.numel() - 1):
        q0, q1, k0, k1 = (int(x) for x in (cu_seqlens_q[b], cu_seqlens_q[b + 1], cu_seqlens_k[b], cu_seqlens_k[b + 1]))
        assert q1 - q0 <= max_seqlen_q and k1 - k0 <= max_seqlen_k
        outs.append(reference_func(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], **options)[0])
    return torch.cat(outs)


class Registered(str):
    calls: dict


@pytest.fixture
def registered(monkeypatch):
    """The integration registered, the kernels replaced by the reference;
    .calls counts the dense and varlen calls."""
    calls = {"dense": 0, "varlen": 0}

    def dense(*args, **kwargs):
        calls["dense"] += 1
        return reference_func(*args, **kwargs)

    def varlen(*args, **kwargs):
        calls["varlen"] += 1
        return reference_varlen_func(*args, **kwargs)

    monkeypatch.setattr(ft_transformers, "_flash_attn_func", dense)
    monkeypatch.setattr(ft_transformers, "_flash_attn_varlen_func", varlen)
    name = Registered(ft_transformers.register())
    name.calls = calls
    return name


def test_register_refuses_names_transformers_takes_for_hub_kernels():
    for bad in ("flashtile", "my_flash", "org/repo", "org/repo:fn", ""):
        with pytest.raises(ValueError, match="name"):
            ft_transformers.register(bad)
    assert ft_transformers.register() == ft_transformers.DEFAULT_NAME
    assert ft_transformers.DEFAULT_NAME in transformers.AttentionInterface().valid_keys()


def tiny_config(kind):
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=128)
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    if kind == "mistral":
        return transformers.MistralConfig(**common, sliding_window=5)
    return transformers.Gemma2Config(**common, sliding_window=5, attn_logit_softcapping=30.0,
                                     final_logit_softcapping=None, query_pre_attn_scalar=16)


def model_pair(kind, name):
    torch.manual_seed(0)
    ours = transformers.AutoModelForCausalLM.from_config(tiny_config(kind), attn_implementation=name)
    eager = transformers.AutoModelForCausalLM.from_config(tiny_config(kind), attn_implementation="eager")
    eager.load_state_dict(ours.state_dict())
    return ours.eval(), eager.eval()


def padded_batch(lengths, seqlen, left):
    """input_ids and attention_mask of a batch padded on the left or right."""
    ids = torch.randint(1, 97, (len(lengths), seqlen))
    mask = torch.zeros(len(lengths), seqlen, dtype=torch.long)
    for b, n in enumerate(lengths):
        if left:
            mask[b, seqlen - n:] = 1
        else:
            mask[b, :n] = 1
    return ids, mask


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2"])
def test_logits_and_gradients_match_eager(kind, registered):
    """No padding (the dense path), then left and right padding (unpadded to
    varlen): logits at the real tokens and the gradients of a loss over
    them, against eager attention."""
    ours, eager = model_pair(kind, registered)
    for lengths, left in (([12, 12, 12], True), ([12, 7, 3], True), ([12, 9, 1], False)):
        ids, mask = padded_batch(lengths, 12, left)
        real = mask.bool()
        results = []
        for model in (ours, eager):
            model.zero_grad()
            logits = model(input_ids=ids, attention_mask=mask).logits
            logits[real].square().mean().backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            assert any("q_proj" in n for n in grads)
            results.append((logits[real].detach(), grads))
        torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-4, atol=1e-5)
        for n, grad in results[0][1].items():
            torch.testing.assert_close(grad, results[1][1][n], rtol=1e-3, atol=1e-5, msg=lambda m: f"{n}: {m}")
    assert registered.calls["dense"] > 0 and registered.calls["varlen"] > 0


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma2"])
def test_greedy_generation_with_a_cache_matches_eager(kind, registered):
    """Decoding with a KV cache and left padding: one query against the cached
    keys, its mask the last column of the padding mask."""
    ours, eager = model_pair(kind, registered)
    ids, mask = padded_batch([9, 4], 9, left=True)
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(ours.generate(ids, **kwargs), eager.generate(ids, **kwargs))


def test_packed_batch_runs_varlen_as_given(registered):
    """Padding-free batches (cu_seq_lens_* from DataCollatorWithFlattening):
    varlen with those offsets, the given maxima or the longest sequence."""
    q = torch.randn(1, 4, 17, 16)
    k, v = torch.randn(1, 2, 17, 16), torch.randn(1, 2, 17, 16)
    cu = torch.tensor([0, 5, 6, 17])
    module = torch.nn.Module()
    module.is_causal = True
    for max_len in (11, None, torch.tensor(11)):
        out, weights = ft_transformers.attention_forward(module, q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                                                         max_length_q=max_len, max_length_k=max_len)
        assert weights is None and out.shape == (1, 17, 4, 16)
        for s, e in ((0, 5), (5, 6), (6, 17)):
            want = reference_func(q[:, :, s:e].transpose(1, 2), k[:, :, s:e].transpose(1, 2),
                                  v[:, :, s:e].transpose(1, 2), causal=True)
            torch.testing.assert_close(out[:, s:e], want)


def test_unsupported_arguments_raise(registered):
    module = torch.nn.Module()
    q = torch.randn(1, 2, 3, 16)
    with pytest.raises(NotImplementedError, match="s_aux"):
        ft_transformers.attention_forward(module, q, q, q, None, s_aux=torch.zeros(2))
    with pytest.raises(NotImplementedError, match="output_attentions"):
        ft_transformers.attention_forward(module, q, q, q, None, output_attentions=True)
    with pytest.raises(ValueError, match="attention_mask"):
        ft_transformers.attention_forward(module, q, q, q, torch.ones(1, 5))
