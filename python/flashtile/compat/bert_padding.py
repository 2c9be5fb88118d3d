"""flash_attn's padding helpers (``flash_attn.bert_padding``), written for flashtile in plain torch.

They convert between a padded batch (batch, seqlen, ...) with a mask of valid tokens and the packed
layout the varlen attention functions take: the valid tokens alone, (total_nnz, ...), plus int32
cumulative sequence lengths. Names, signatures, return values and dtypes are those of flash_attn 2.x
(``unpad_input`` returns five values), so ``from flashtile.compat.bert_padding import ...`` can replace
``from flash_attn.bert_padding import ...``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "IndexFirstAxis",
    "IndexFirstAxisResidual",
    "IndexPutFirstAxis",
    "index_first_axis",
    "index_first_axis_residual",
    "index_put_first_axis",
    "pad_input",
    "unpad_input",
    "unpad_input_for_concatenated_sequences",
]


class IndexFirstAxis(torch.autograd.Function):
    """input (first_axis_dim, ...), indices (nnz,) int64 -> input[indices], (nnz, ...).

    The backward scatters the incoming gradient into zeros of the input's shape.
    """

    @staticmethod
    def forward(ctx, input: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(indices)
        ctx.first_axis_dim = input.shape[0]
        return input.index_select(0, indices)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (indices,) = ctx.saved_tensors
        grad_input = grad_output.new_zeros(ctx.first_axis_dim, *grad_output.shape[1:])
        grad_input.index_copy_(0, indices, grad_output)
        return grad_input, None


index_first_axis = IndexFirstAxis.apply


class IndexPutFirstAxis(torch.autograd.Function):
    """values (nnz, ...), indices (nnz,) int64 -> zeros (first_axis_dim, ...) with values at indices.

    The backward gathers the rows at indices from the incoming gradient.
    """

    @staticmethod
    def forward(ctx, values: torch.Tensor, indices: torch.Tensor, first_axis_dim: int) -> torch.Tensor:
        ctx.save_for_backward(indices)
        output = values.new_zeros(first_axis_dim, *values.shape[1:])
        output[indices] = values
        return output

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (indices,) = ctx.saved_tensors
        return grad_output[indices], None, None


index_put_first_axis = IndexPutFirstAxis.apply


class IndexFirstAxisResidual(torch.autograd.Function):
    """input (first_axis_dim, ...), indices (nnz,) -> (input[indices], input detached).

    The second output lets a caller use the whole input as a residual next to the gathered rows
    while autograd records one node: the backward adds the gathered rows' gradient into the
    residual's gradient at indices.
    """

    @staticmethod
    def forward(ctx, input: torch.Tensor, indices: torch.Tensor):
        ctx.save_for_backward(indices)
        # Returned as is, the input would come back as a view output of a two-output function,
        # which autograd forbids modifying in place; callers add into the residual in place.
        return input[indices], input.detach()

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor, grad_residual: torch.Tensor):
        (indices,) = ctx.saved_tensors
        return grad_residual.index_add(0, indices, grad_output), None


index_first_axis_residual = IndexFirstAxisResidual.apply


def _pack_from_flat_mask(hidden_states: torch.Tensor, token_mask: torch.Tensor):
    """Rows of hidden_states (batch, seqlen, ...) where token_mask (batch, seqlen) is nonzero.

    Returns the gathered rows (nnz, ...) and their int64 indices into the flattened batch*seqlen axis.
    """
    indices = torch.nonzero(token_mask.flatten(), as_tuple=False).flatten()
    flat_states = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat_states, indices), indices


def _cumulative_lengths(seqlens: torch.Tensor) -> torch.Tensor:
    """(n,) lengths -> (n + 1,) int32 offsets starting at 0."""
    return F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))


def unpad_input(
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor,
    unused_mask: torch.Tensor | None = None,
):
    """Pack the valid tokens of a padded batch.

    Arguments:
        hidden_states: (batch, seqlen, ...).
        attention_mask: (batch, seqlen), bool or integer; nonzero marks a valid token.
        unused_mask: optional (batch, seqlen), bool or integer; nonzero marks a token that is
            allocated but unused. Such tokens are packed too (they count in cu_seqlens and
            max_seqlen_in_batch) but not in seqused. It should not overlap attention_mask.
    Returns:
        hidden_states_unpadded: (total_nnz, ...), the kept tokens in row-major (batch, seqlen) order.
        indices: (total_nnz,) int64, their positions in the flattened batch * seqlen axis.
        cu_seqlens: (batch + 1,) int32, cumulative kept-token counts starting at 0.
        max_seqlen_in_batch: Python int, the most kept tokens in any row.
        seqused: (batch,) int32, the valid (attention_mask) tokens of each row.
    """
    kept_mask = attention_mask if unused_mask is None else attention_mask + unused_mask
    seqlens = kept_mask.sum(dim=-1, dtype=torch.int32)
    seqused = attention_mask.sum(dim=-1, dtype=torch.int32)
    hidden_states_unpadded, indices = _pack_from_flat_mask(hidden_states, kept_mask)
    return hidden_states_unpadded, indices, _cumulative_lengths(seqlens), seqlens.max().item(), seqused


def unpad_input_for_concatenated_sequences(
    hidden_states: torch.Tensor, attention_mask_in_length: torch.Tensor
):
    """Pack a batch whose rows each hold several short sequences laid end to end.

    Row b of attention_mask_in_length lists the lengths of the sequences concatenated at the start
    of row b of hidden_states, followed by zeros: with seqlen 6, the row [2, 3, 0, 0, 0, 0] says
    that tokens 0-1 form one sequence, tokens 2-4 another and token 5 is padding. Every sequence
    becomes a sequence of its own in the packed output, so attention never crosses from one to the
    next.

    Arguments:
        hidden_states: (batch, seqlen, ...).
        attention_mask_in_length: (batch, seqlen), integer.
    Returns:
        hidden_states_unpadded: (total_nnz, ...), the tokens covered by the sequences.
        indices: (total_nnz,) int64, their positions in the flattened batch * seqlen axis.
        cu_seqlens: (num_sequences + 1,) int32, cumulative lengths of all sequences, row by row.
        max_seqlen_in_batch: Python int, the longest sequence.
    """
    seqlen = attention_mask_in_length.shape[-1]
    covered_per_row = attention_mask_in_length.sum(dim=-1)
    positions = torch.arange(seqlen, device=attention_mask_in_length.device)
    token_mask = positions.unsqueeze(0) < covered_per_row.unsqueeze(1)
    flat_lengths = attention_mask_in_length.flatten()
    seqlens = flat_lengths[flat_lengths != 0]
    hidden_states_unpadded, indices = _pack_from_flat_mask(hidden_states, token_mask)
    return hidden_states_unpadded, indices, _cumulative_lengths(seqlens), seqlens.max().item()


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Undo unpad_input: hidden_states (total_nnz, ...) back to (batch, seqlen, ...), zeros elsewhere.

    indices: (total_nnz,) int64 positions in the flattened batch * seqlen axis, as unpad_input returns.
    """
    padded = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return padded.reshape(batch, seqlen, *padded.shape[1:])
