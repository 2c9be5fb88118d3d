"""flashtile as an attention implementation of Hugging Face transformers (5.x).

    import flashtile.integrations.transformers as ft_transformers
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation=ft_transformers.register())

``register()`` adds :func:`attention_forward` to transformers' attention
interface, and transformers' own flash-attention mask builder (a padding mask
of shape (batch, kv_length), or None when nothing is padded) to its mask
interface, under ``name`` (default ``"tile_attention"``). A name containing
"flash" is refused: transformers 5 takes such a name for a Flash Attention
kernel to load from the Hub, and the model would fail to load; so is a name
of the Hub's ``org/repo`` form.

What models pass is handled as transformers' flash-attention path handles it:
a padding mask unpads the batch into a varlen one (``cu_seqlens``; the
unpadding reads the mask's counts on the host, as transformers' does), a
batch without padding runs dense with no host synchronization, and a packed
padding-free batch (``cu_seq_lens_q``/``cu_seq_lens_k`` from transformers'
flattening data collator) runs varlen as given. Sliding windows
(``sliding_window``: the key itself and the ``sliding_window - 1`` before
it), softcap (Gemma 2), GQA/MQA, dropout, ``scaling`` and
``deterministic`` pass through to the kernels. Attention sinks (``s_aux``)
and attention weights (``output_attentions``) are not supported and raise.
"""

import torch
import torch.nn.functional as F

from .. import interface
from ..compat.bert_padding import index_first_axis, pad_input, unpad_input

DEFAULT_NAME = "tile_attention"

# The kernels' entry points, looked up at call time through this module so
# that a test can stand a reference in for them on a machine without a GPU.
_flash_attn_func = interface.flash_attn_func
_flash_attn_varlen_func = interface.flash_attn_varlen_func


def register(name: str = DEFAULT_NAME) -> str:
    """Registers flashtile with transformers under ``name`` and returns it,
    for ``attn_implementation=`` (``from_pretrained``, a config, or
    ``model.set_attn_implementation``)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty string, got {name!r}")
    if "flash" in name:
        raise ValueError(f"name {name!r}: transformers 5 takes any attention implementation whose name contains "
                         f"'flash' for a Flash Attention kernel to load from the Hub; choose another name "
                         f"(the default is {DEFAULT_NAME!r})")
    if "/" in name or ":" in name or "@" in name:
        raise ValueError(f"name {name!r}: transformers takes a name with '/', ':' or '@' for a Hub kernel")
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError as exc:
        raise ImportError("flashtile.integrations.transformers.register() needs transformers 5 "
                          f"(AttentionInterface, masking_utils.AttentionMaskInterface): {exc}") from exc
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                      softcap=None, is_causal=None, s_aux=None, **kwargs):
    """transformers' attention function signature: query (batch, nheads,
    seqlen_q, headdim), key and value (batch, nheads_k, seqlen_k, headdim),
    attention_mask None or (batch, seqlen_k) with nonzero for a real token.
    Returns (out (batch, seqlen_q, nheads, headdim), None)."""
    if s_aux is not None:
        raise NotImplementedError("flashtile does not implement attention sinks (s_aux)")
    if kwargs.get("output_attentions", False):
        raise NotImplementedError("flashtile does not return attention weights (output_attentions=True); "
                                  "use attn_implementation='eager' for them")
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # (batch, seqlen, heads, headdim)
    head_dim_v = v.shape[-1]
    if head_dim_v < q.shape[-1]:  # a narrower V (MLA-style models) runs zero-padded
        v = F.pad(v, (0, q.shape[-1] - head_dim_v))
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    options = dict(
        dropout_p=dropout,
        softmax_scale=scaling,
        causal=causal,
        window_size=(-1, -1) if sliding_window is None else (sliding_window - 1, sliding_window - 1),
        softcap=0.0 if softcap is None else softcap,
        deterministic=bool(kwargs.get("deterministic") or False),
    )
    cu_seqlens_q, cu_seqlens_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_seqlens_q is not None and cu_seqlens_k is not None:
        out = _packed(q, k, v, cu_seqlens_q, cu_seqlens_k, kwargs.get("max_length_q"), kwargs.get("max_length_k"),
                      options)
    elif attention_mask is None:
        out = _flash_attn_func(q, k, v, **options)
    else:
        out = _unpadded(q, k, v, attention_mask, options)
    return out[..., :head_dim_v], None


def _packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_length_q, max_length_k, options):
    """A padding-free batch: batch 1, its sequences laid end to end."""
    if q.shape[0] != 1:
        raise ValueError(f"cu_seq_lens_q: a packed batch has batch size 1, got query of batch {q.shape[0]}")

    def bound(max_length, cu_seqlens):
        if max_length is None:  # the longest sequence; one read on the host
            return int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        return int(max_length)

    out = _flash_attn_varlen_func(q[0], k[0], v[0], cu_seqlens_q.to(torch.int32), cu_seqlens_k.to(torch.int32),
                                  bound(max_length_q, cu_seqlens_q), bound(max_length_k, cu_seqlens_k), **options)
    return out.unsqueeze(0)


def _unpadded(q, k, v, attention_mask, options):
    """A padded batch: its real tokens packed into a varlen batch and the
    output scattered back (padded query rows get zeros). The mask covers the
    keys; the queries are the last seqlen_q of them (decoding with a cache)."""
    batch, seqlen_q = q.shape[:2]
    seqlen_k = k.shape[1]
    if attention_mask.shape != (batch, seqlen_k):
        raise ValueError(f"attention_mask: expected shape {(batch, seqlen_k)} (batch, seqlen_k), "
                         f"got {tuple(attention_mask.shape)}")
    k_packed, indices_k, cu_seqlens_k, max_seqlen_k, _ = unpad_input(k, attention_mask)
    v_packed = index_first_axis(v.reshape(batch * seqlen_k, *v.shape[2:]), indices_k)
    if seqlen_q == seqlen_k:
        q_packed = index_first_axis(q.reshape(batch * seqlen_q, *q.shape[2:]), indices_k)
        indices_q, cu_seqlens_q, max_seqlen_q = indices_k, cu_seqlens_k, max_seqlen_k
    else:
        q_packed, indices_q, cu_seqlens_q, max_seqlen_q, _ = unpad_input(q, attention_mask[:, -seqlen_q:])
    out = _flash_attn_varlen_func(q_packed, k_packed, v_packed, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, **options)
    return pad_input(out, indices_q, batch, seqlen_q)
