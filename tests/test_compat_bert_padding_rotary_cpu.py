"""CPU tests of flashtile.compat.bert_padding and flashtile.compat.layers.rotary.

The padding helpers are checked against index lists built with Python loops, and the rotary
embedding against a reference that treats each feature pair as a complex number multiplied by
exp(i * theta), computed in float64 from the angles themselves rather than from cos/sin tables.
"""

from __future__ import annotations

import math

import pytest
import torch

from flashtile.compat.bert_padding import (
    index_first_axis,
    index_first_axis_residual,
    index_put_first_axis,
    pad_input,
    unpad_input,
    unpad_input_for_concatenated_sequences,
)
from flashtile.compat.layers.rotary import (
    RotaryEmbedding,
    apply_rotary_emb,
    apply_rotary_emb_func,
    apply_rotary_emb_kv_,
    apply_rotary_emb_qkv_,
    apply_rotary_emb_torch,
)

# ---------------------------------------------------------------------------------------------------
# bert_padding
# ---------------------------------------------------------------------------------------------------


def random_token_mask(batch: int, seqlen: int) -> torch.Tensor:
    """Bool (batch, seqlen) with scattered valid tokens; row 0 holds none and row 1 is full."""
    mask = torch.rand(batch, seqlen) < 0.6
    mask[0] = False
    mask[1] = True
    return mask


def loop_packing(kept: torch.Tensor):
    """Indices, per-row lengths and offsets of the nonzero entries of kept (batch, seqlen), by loops."""
    batch, seqlen = kept.shape
    indices = [b * seqlen + s for b in range(batch) for s in range(seqlen) if kept[b, s]]
    lengths = [int(kept[b].count_nonzero()) for b in range(batch)]
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    return indices, lengths, offsets


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int32, torch.int64])
def test_unpad_input_matches_loops(mask_dtype):
    batch, seqlen = 6, 17
    hidden = torch.randn(batch, seqlen, 3, 5)
    mask = random_token_mask(batch, seqlen)

    unpadded, indices, cu_seqlens, max_seqlen, seqused = unpad_input(hidden, mask.to(mask_dtype))

    expected_indices, lengths, offsets = loop_packing(mask)
    assert indices.dtype == torch.int64 and indices.tolist() == expected_indices
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == offsets
    assert seqused.dtype == torch.int32 and seqused.tolist() == lengths
    assert type(max_seqlen) is int and max_seqlen == seqlen
    rows = [hidden[i // seqlen, i % seqlen] for i in expected_indices]
    assert torch.equal(unpadded, torch.stack(rows))


def test_pad_input_inverts_unpad_input():
    batch, seqlen = 5, 17
    hidden = torch.randn(batch, seqlen, 7)
    mask = random_token_mask(batch, seqlen)

    unpadded, indices, _, max_seqlen, _ = unpad_input(hidden, mask)
    padded = pad_input(unpadded, indices, batch, seqlen)

    assert padded.shape == hidden.shape
    assert torch.equal(padded, hidden * mask.unsqueeze(-1))
    assert max_seqlen == max(loop_packing(mask)[1])


def test_unpad_input_keeps_unused_tokens_out_of_seqused():
    batch, seqlen = 4, 17
    hidden = torch.randn(batch, seqlen, 2, 3)
    positions = torch.arange(seqlen)
    used_lengths = torch.tensor([0, 17, 5, 9])
    unused_lengths = torch.tensor([3, 0, 4, 8])
    attention_mask = positions < used_lengths.unsqueeze(1)
    unused_mask = (positions >= used_lengths.unsqueeze(1)) & (
        positions < (used_lengths + unused_lengths).unsqueeze(1)
    )

    unpadded, indices, cu_seqlens, max_seqlen, seqused = unpad_input(hidden, attention_mask, unused_mask)

    expected_indices, kept_lengths, offsets = loop_packing(attention_mask | unused_mask)
    assert indices.tolist() == expected_indices
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == offsets
    assert kept_lengths == (used_lengths + unused_lengths).tolist()
    assert max_seqlen == 17
    assert seqused.dtype == torch.int32 and seqused.tolist() == used_lengths.tolist()
    assert torch.equal(pad_input(unpadded, indices, batch, seqlen),
                       hidden * (attention_mask | unused_mask)[:, :, None, None])


def test_index_first_axis_gathers_and_scatters_gradient():
    source = torch.randn(11, 3, 2, dtype=torch.float64, requires_grad=True)
    indices = torch.randperm(11)[:6]

    gathered = index_first_axis(source, indices)
    assert torch.equal(gathered, source.detach()[indices])
    grad_out = torch.randn_like(gathered)
    gathered.backward(grad_out)
    expected_grad = torch.zeros_like(source)
    expected_grad[indices] = grad_out
    assert torch.equal(source.grad, expected_grad)

    assert torch.autograd.gradcheck(lambda t: index_first_axis(t, indices), (source,))


def test_index_put_first_axis_and_pad_input_gradcheck():
    batch, seqlen = 3, 5
    mask = random_token_mask(batch, seqlen)
    _, indices, _, _, _ = unpad_input(torch.zeros(batch, seqlen, 1), mask)
    values = torch.randn(indices.numel(), 2, 3, dtype=torch.float64, requires_grad=True)

    placed = index_put_first_axis(values, indices, batch * seqlen)
    expected = torch.zeros(batch * seqlen, 2, 3, dtype=torch.float64)
    expected[indices] = values.detach()
    assert torch.equal(placed, expected)

    assert torch.autograd.gradcheck(lambda t: index_put_first_axis(t, indices, batch * seqlen), (values,))
    assert torch.autograd.gradcheck(lambda t: pad_input(t, indices, batch, seqlen), (values,))


def test_unpad_input_gradcheck():
    batch, seqlen = 3, 5
    mask = random_token_mask(batch, seqlen)
    hidden = torch.randn(batch, seqlen, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: unpad_input(t, mask)[0], (hidden,))


def test_index_first_axis_residual():
    source = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
    indices = torch.tensor([5, 0, 3])

    gathered, residual = index_first_axis_residual(source, indices)
    assert torch.equal(gathered, source.detach()[indices])
    assert torch.equal(residual, source.detach())
    assert torch.autograd.gradcheck(lambda t: index_first_axis_residual(t, indices), (source,))


def test_unpad_input_for_concatenated_sequences_hand_example():
    lengths_per_row = torch.tensor(
        [
            [2, 3, 0, 0, 0, 0],  # tokens 0-1 and 2-4, token 5 is padding
            [4, 0, 0, 0, 0, 0],  # tokens 0-3
            [0, 0, 0, 0, 0, 0],  # all padding
            [1, 1, 4, 0, 0, 0],  # tokens 0, 1 and 2-5
        ],
        dtype=torch.int32,
    )
    hidden = torch.randn(4, 6, 3)

    unpadded, indices, cu_seqlens, max_seqlen = unpad_input_for_concatenated_sequences(
        hidden, lengths_per_row
    )

    assert indices.dtype == torch.int64
    assert indices.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 18, 19, 20, 21, 22, 23]
    assert cu_seqlens.dtype == torch.int32
    assert cu_seqlens.tolist() == [0, 2, 5, 9, 10, 11, 15]
    assert type(max_seqlen) is int and max_seqlen == 4
    assert torch.equal(unpadded, hidden.reshape(24, 3)[indices])


# ---------------------------------------------------------------------------------------------------
# rotary
# ---------------------------------------------------------------------------------------------------

BATCH, SEQLEN, NHEADS, HEADDIM = 3, 17, 3, 40


def random_angles(seqlen_ro: int, rotary_dim: int) -> torch.Tensor:
    """(seqlen_ro, rotary_dim / 2) float64 angles spanning several turns."""
    return (torch.rand(seqlen_ro, rotary_dim // 2, dtype=torch.float64) - 0.5) * 8 * math.pi


def complex_rotary_reference(x: torch.Tensor, multiplier: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x (..., nheads, headdim) times multiplier (..., rotary_dim / 2), complex, per feature pair.

    The pair of a GPT-NeoX layout is (i, i + rotary_dim / 2); of a GPT-J layout, (2i, 2i + 1).
    Computed in float64 (complex128), returned in float64.
    """
    x = x.double()
    rotary_dim = 2 * multiplier.shape[-1]
    x_rot = x[..., :rotary_dim]
    if interleaved:
        pairs = torch.complex(x_rot[..., 0::2], x_rot[..., 1::2])
    else:
        pairs = torch.complex(x_rot[..., : rotary_dim // 2], x_rot[..., rotary_dim // 2 :])
    turned = pairs * multiplier.unsqueeze(-2)
    if interleaved:
        rotated = torch.view_as_real(turned).flatten(-2)
    else:
        rotated = torch.cat((turned.real, turned.imag), dim=-1)
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def unit_phase(angles: torch.Tensor) -> torch.Tensor:
    return torch.polar(torch.ones_like(angles), angles)


def make_offsets(kind: str, batch: int):
    """The seqlen_offsets argument and the per-sequence offsets as a list."""
    if kind == "zero":
        return 0, [0] * batch
    if kind == "int":
        return 6, [6] * batch
    offsets = torch.randint(0, 9, (batch,), dtype=torch.int32)
    return offsets, offsets.tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offsets_kind", ["zero", "int", "tensor"])
@pytest.mark.parametrize("rotary_dim", [24, HEADDIM])
@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_emb_matches_complex_reference(interleaved, rotary_dim, offsets_kind, dtype):
    seqlen_ro = SEQLEN + 8
    angles = random_angles(seqlen_ro, rotary_dim)
    cos, sin = angles.cos().float(), angles.sin().float()
    x = torch.randn(BATCH, SEQLEN, NHEADS, HEADDIM).to(dtype)
    x_before = x.clone()
    seqlen_offsets, offsets = make_offsets(offsets_kind, BATCH)

    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets)

    positions = torch.tensor(offsets).unsqueeze(1) + torch.arange(SEQLEN)  # (batch, seqlen)
    expected = complex_rotary_reference(x, unit_phase(angles[positions]), interleaved)
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(x, x_before)
    if dtype == torch.float32:
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(out, expected.to(dtype))
    assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:])


def test_tensor_offsets_past_the_tables_leave_tokens_unrotated():
    angles = random_angles(SEQLEN, 24)
    x = torch.randn(2, SEQLEN, NHEADS, HEADDIM)
    seqlen_offsets = torch.tensor([0, 5])

    out = apply_rotary_emb(x, angles.cos().float(), angles.sin().float(), seqlen_offsets=seqlen_offsets)

    expected_first = complex_rotary_reference(x[0], unit_phase(angles), interleaved=False)
    expected_second_sequence = complex_rotary_reference(x[1, :-5], unit_phase(angles[5:]), interleaved=False)
    torch.testing.assert_close(out[0].double(), expected_first, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1, :-5].double(), expected_second_sequence, atol=1e-5, rtol=1e-5)
    assert torch.equal(out[1, -5:], x[1, -5:])


@pytest.mark.parametrize("offsets_kind", ["zero", "int", "tensor"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_emb_varlen_matches_complex_reference(interleaved, offsets_kind):
    lengths = [5, 1, 17, 0, 9]
    cu_seqlens = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    total = cu_seqlens[-1].item()
    angles = random_angles(SEQLEN + 8, 24)
    x = torch.randn(total, NHEADS, HEADDIM)
    seqlen_offsets, offsets = make_offsets(offsets_kind, len(lengths))

    out = apply_rotary_emb(
        x,
        angles.cos().float(),
        angles.sin().float(),
        interleaved=interleaved,
        seqlen_offsets=seqlen_offsets,
        cu_seqlens=cu_seqlens,
        max_seqlen=max(lengths),
    )

    positions = torch.cat([torch.arange(length) + offset for length, offset in zip(lengths, offsets)])
    expected = complex_rotary_reference(x, unit_phase(angles[positions]), interleaved)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_emb_inplace(interleaved):
    angles = random_angles(SEQLEN, 24)
    cos, sin = angles.cos().float(), angles.sin().float()
    x = torch.randn(BATCH, SEQLEN, NHEADS, HEADDIM)
    expected = apply_rotary_emb(x, cos, sin, interleaved=interleaved)

    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, inplace=True)

    assert out.data_ptr() == x.data_ptr()
    assert torch.equal(x, expected)

    # A leaf that requires grad is accepted, as flash_attn's own tests use it, and its gradient
    # is the rotation by the opposite angle.
    leaf = torch.randn(BATCH, SEQLEN, NHEADS, HEADDIM, dtype=torch.float64, requires_grad=True)
    grad_out = torch.randn_like(leaf)
    out = apply_rotary_emb(leaf, cos.double(), sin.double(), interleaved=interleaved, inplace=True)
    out.backward(grad_out)
    expected_grad = complex_rotary_reference(grad_out, unit_phase(-angles), interleaved)
    torch.testing.assert_close(leaf.grad, expected_grad)


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_emb_gradcheck(interleaved, inplace):
    angles = random_angles(9, 6)
    cos, sin = angles.cos(), angles.sin()
    x = torch.randn(2, 5, 2, 10, dtype=torch.float64, requires_grad=True)
    offsets = torch.tensor([1, 4])

    def rotate(t):
        return apply_rotary_emb(t.clone(), cos, sin, interleaved=interleaved, inplace=inplace,
                                seqlen_offsets=offsets)

    assert torch.autograd.gradcheck(rotate, (x,))

    cu_seqlens = torch.tensor([0, 3, 7], dtype=torch.int32)
    packed = torch.randn(7, 2, 10, dtype=torch.float64, requires_grad=True)

    def rotate_packed(t):
        return apply_rotary_emb(t.clone(), cos, sin, interleaved=interleaved, inplace=inplace,
                                seqlen_offsets=offsets, cu_seqlens=cu_seqlens, max_seqlen=4)

    assert torch.autograd.gradcheck(rotate_packed, (packed,))


def test_apply_rotary_emb_rejects_bad_arguments():
    angles = random_angles(SEQLEN, 24)
    cos, sin = angles.cos(), angles.sin()
    with pytest.raises(ValueError, match="rotary_dim"):
        apply_rotary_emb(torch.randn(1, SEQLEN, 1, 16), cos, sin)
    with pytest.raises(ValueError, match="max_seqlen"):
        apply_rotary_emb(torch.randn(SEQLEN, 1, HEADDIM), cos, sin, cu_seqlens=torch.tensor([0, SEQLEN]))
    with pytest.raises(ValueError, match="seqlen_offsets"):
        apply_rotary_emb(torch.randn(1, SEQLEN, 1, HEADDIM), cos, sin, seqlen_offsets=1)
    assert apply_rotary_emb_func is apply_rotary_emb


@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_emb_torch_matches_complex_reference(interleaved):
    angles = random_angles(SEQLEN, 24)
    x = torch.randn(BATCH, SEQLEN, NHEADS, HEADDIM, dtype=torch.float64)
    out = apply_rotary_emb_torch(x, angles.cos(), angles.sin(), interleaved=interleaved)
    torch.testing.assert_close(out, complex_rotary_reference(x, unit_phase(angles), interleaved))


@pytest.mark.parametrize("separate_key_tables", [False, True])
@pytest.mark.parametrize("grouped_heads", [False, True])
@pytest.mark.parametrize("offsets_kind", ["zero", "tensor"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_emb_qkv_(interleaved, offsets_kind, grouped_heads, separate_key_tables):
    num_heads_q, num_heads_k = (4, 2) if grouped_heads else (NHEADS, NHEADS)
    if grouped_heads:
        qkv = torch.randn(BATCH, SEQLEN, num_heads_q + 2 * num_heads_k, HEADDIM)
        q, k, v = qkv.split([num_heads_q, num_heads_k, num_heads_k], dim=2)
    else:
        qkv = torch.randn(BATCH, SEQLEN, 3, NHEADS, HEADDIM)
        q, k, v = qkv.unbind(2)
    q, k, v = q.clone(), k.clone(), v.clone()
    angles = random_angles(SEQLEN + 8, 24)
    angles_k = random_angles(SEQLEN + 8, 24) if separate_key_tables else angles
    seqlen_offsets, offsets = make_offsets(offsets_kind, BATCH)

    out = apply_rotary_emb_qkv_(
        qkv,
        angles.cos().float(),
        angles.sin().float(),
        angles_k.cos().float() if separate_key_tables else None,
        angles_k.sin().float() if separate_key_tables else None,
        interleaved=interleaved,
        seqlen_offsets=seqlen_offsets,
        num_heads_q=num_heads_q if grouped_heads else None,
    )

    assert out.data_ptr() == qkv.data_ptr()
    positions = torch.tensor(offsets).unsqueeze(1) + torch.arange(SEQLEN)
    if grouped_heads:
        out_q, out_k, out_v = out.split([num_heads_q, num_heads_k, num_heads_k], dim=2)
    else:
        out_q, out_k, out_v = out.unbind(2)
    expected_q = complex_rotary_reference(q, unit_phase(angles[positions]), interleaved)
    expected_k = complex_rotary_reference(k, unit_phase(angles_k[positions]), interleaved)
    torch.testing.assert_close(out_q.double(), expected_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_k.double(), expected_k, atol=1e-5, rtol=1e-5)
    assert torch.equal(out_v, v)


@pytest.mark.parametrize("grouped_heads", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_emb_qkv_gradcheck(interleaved, grouped_heads):
    angles, angles_k = random_angles(8, 4), random_angles(8, 4)
    shape = (2, 5, 2 + 2 * 1, 6) if grouped_heads else (2, 5, 3, 2, 6)
    qkv = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    offsets = torch.tensor([0, 3])

    def rotate(t):
        return apply_rotary_emb_qkv_(t.clone(), angles.cos(), angles.sin(), angles_k.cos(), angles_k.sin(),
                                     interleaved=interleaved, seqlen_offsets=offsets,
                                     num_heads_q=2 if grouped_heads else None)

    assert torch.autograd.gradcheck(rotate, (qkv,))


@pytest.mark.parametrize("offsets_kind", ["int", "tensor"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_emb_kv_(interleaved, offsets_kind):
    kv = torch.randn(BATCH, SEQLEN, 2, NHEADS, HEADDIM)
    k, v = kv[:, :, 0].clone(), kv[:, :, 1].clone()
    angles = random_angles(SEQLEN + 8, 24)
    seqlen_offsets, offsets = make_offsets(offsets_kind, BATCH)

    out = apply_rotary_emb_kv_(
        kv, angles.cos().float(), angles.sin().float(), interleaved=interleaved, seqlen_offsets=seqlen_offsets
    )

    assert out.data_ptr() == kv.data_ptr()
    positions = torch.tensor(offsets).unsqueeze(1) + torch.arange(SEQLEN)
    expected_k = complex_rotary_reference(k, unit_phase(angles[positions]), interleaved)
    torch.testing.assert_close(out[:, :, 0].double(), expected_k, atol=1e-5, rtol=1e-5)
    assert torch.equal(out[:, :, 1], v)

    angles = random_angles(8, 4)
    kv = torch.randn(2, 5, 2, 2, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda t: apply_rotary_emb_kv_(t.clone(), angles.cos(), angles.sin(), interleaved,
                                       torch.tensor([2, 0])),
        (kv,),
    )


def rotary_embedding_multipliers(dim: int, base: float, positions: torch.Tensor, cache_len: int,
                                 scale_base: float | None):
    """Complex per-pair multipliers (q's, k's) of RotaryEmbedding at positions, in float64."""
    pair_starts = torch.arange(0, dim, 2, dtype=torch.float64)
    angles = positions.double().unsqueeze(-1) * base ** (-pair_starts / dim)
    phase = unit_phase(angles)
    if scale_base is None:
        return phase, phase
    decay = ((pair_starts + 0.4 * dim) / (1.4 * dim)) ** ((positions.double().unsqueeze(-1) - cache_len // 2)
                                                          / scale_base)
    return phase * decay, phase / decay


@pytest.mark.parametrize("scale_base", [None, 512.0])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_embedding_packed_qkv(interleaved, scale_base):
    rotary_dim, seqlen_offset = 24, 5
    module = RotaryEmbedding(rotary_dim, base=500.0, interleaved=interleaved, scale_base=scale_base)
    qkv = torch.randn(BATCH, SEQLEN, 3, NHEADS, HEADDIM)
    q, k, v = (t.clone() for t in qkv.unbind(2))

    out = module(qkv, seqlen_offset=seqlen_offset)

    positions = torch.arange(SEQLEN) + seqlen_offset
    multiplier_q, multiplier_k = rotary_embedding_multipliers(rotary_dim, 500.0, positions,
                                                              SEQLEN + seqlen_offset, scale_base)
    assert out.data_ptr() == qkv.data_ptr()
    torch.testing.assert_close(out[:, :, 0].double(), complex_rotary_reference(q, multiplier_q, interleaved),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[:, :, 1].double(), complex_rotary_reference(k, multiplier_k, interleaved),
                               atol=1e-5, rtol=1e-5)
    assert torch.equal(out[:, :, 2], v)


@pytest.mark.parametrize("scale_base", [None, 512.0])
def test_rotary_embedding_separate_kv_with_tensor_offsets(scale_base):
    rotary_dim, max_seqlen = 24, 40
    module = RotaryEmbedding(rotary_dim, scale_base=scale_base)
    q = torch.randn(BATCH, SEQLEN, NHEADS, HEADDIM)
    kv = torch.randn(BATCH, SEQLEN, 2, NHEADS, HEADDIM)
    q_before, k_before, v_before = q.clone(), kv[:, :, 0].clone(), kv[:, :, 1].clone()
    offsets = torch.randint(0, max_seqlen - SEQLEN + 1, (BATCH,))

    out_q, out_kv = module(q, kv, seqlen_offset=offsets, max_seqlen=max_seqlen)

    positions = offsets.unsqueeze(1) + torch.arange(SEQLEN)
    multiplier_q, multiplier_k = rotary_embedding_multipliers(rotary_dim, 10000.0, positions, max_seqlen,
                                                              scale_base)
    assert out_q.data_ptr() == q.data_ptr() and out_kv.data_ptr() == kv.data_ptr()
    torch.testing.assert_close(out_q.double(), complex_rotary_reference(q_before, multiplier_q, False),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_kv[:, :, 0].double(),
                               complex_rotary_reference(k_before, multiplier_k, False), atol=1e-5, rtol=1e-5)
    assert torch.equal(out_kv[:, :, 1], v_before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_embedding_grouped_heads_matches_functional_form(dtype):
    num_heads_q, num_heads_k, rotary_dim, seqlen_offset = 4, 2, 24, 3
    module = RotaryEmbedding(rotary_dim, interleaved=True)
    qkv = torch.randn(BATCH, SEQLEN, num_heads_q + 2 * num_heads_k, HEADDIM).to(dtype)
    expected = qkv.clone()

    module(qkv, seqlen_offset=seqlen_offset, num_heads_q=num_heads_q)

    assert module._cos_cached.dtype == dtype and module._cos_cached.shape == (SEQLEN + seqlen_offset, 12)
    cos, sin = module._cos_cached, module._sin_cached
    for heads in (slice(0, num_heads_q), slice(num_heads_q, num_heads_q + num_heads_k)):
        expected[:, :, heads] = apply_rotary_emb(
            expected[:, :, heads], cos, sin, interleaved=True, seqlen_offsets=seqlen_offset
        )
    assert torch.equal(qkv, expected)


def test_rotary_embedding_tensor_offsets_need_max_seqlen():
    module = RotaryEmbedding(8)
    with pytest.raises(ValueError, match="max_seqlen"):
        module(torch.randn(2, 4, 3, 1, 8), seqlen_offset=torch.tensor([0, 1]))
