"""Context parallelism: exact ring attention over a torch.distributed group.

Each rank holds a slice of the sequence (``zigzag_split``); the ranks' keys
and values travel around the ring while each rank attends to the slice it
holds, and the partial outputs are merged through their logsumexps in fp32.
The backward sends each key slice's dK and dV accumulators around with it,
so they arrive back at their owner summed over every rank's queries.

Causal attention uses the zigzag split: the sequence is cut into 2·N chunks
and rank r holds chunks r and 2N−1−r, so that every rank has as many visible
(query, key) pairs. At the ring step where rank r holds source j's keys:

- j == r: its own keys, causal;
- j < r: every local query sees all of j's first chunk and none of its second;
- j > r: only the local second chunk's queries see anything, all of j's keys.

A sliding window (``window_size``, flash_attn's: query i sees key j iff
i − left ≤ j ≤ i + right in the whole sequence, a side of −1 unbounded;
causal sets right to 0) is applied per pair of chunks, at their places in
the whole sequence: each pair's rows that see none of its keys and keys
that none of its rows sees are cut off, what remains runs with the window
shifted to that block, and a pair (or a whole step) outside the window runs
no kernel at all.

``simulate_ring_flash_attn`` runs the same steps for N virtual ranks in one
process (the slices in a loop, no communication), which is how the tests
check the ring's exactness on one GPU.

Fixed-length batches (batch, seqlen, nheads, head_dim), MQA/GQA, causal or
not, sliding windows. Varlen batches (``ring_flash_attn_varlen_func``):
every sequence is zigzag-split on its own (``zigzag_split_varlen``), so each
rank holds chunks r and 2N−1−r of each sequence, packed, and the ranks'
cu_seqlens are the whole batch's divided by N; causal or not, windows. The
steps are the same three cases, per sequence at once: the source's
first chunks are its keys up to ``seqused_k``, the local second chunks are
gathered into a packed batch of their own. With a window each sequence's
blocks run on their own (as a batch of one).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.distributed as dist

__all__ = ["ring_flash_attn_func", "ring_flash_attn_varlen_func", "simulate_ring_flash_attn",
           "simulate_ring_flash_attn_varlen", "zigzag_cu_seqlens", "zigzag_split", "zigzag_split_varlen",
           "zigzag_unsplit", "zigzag_unsplit_varlen"]


# --------------------------------------------------------------------------
# the zigzag layout
# --------------------------------------------------------------------------


def _check_split(seqlen: int, world_size: int, name: str) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if seqlen % (2 * world_size) != 0:
        raise ValueError(f"{name}: the sequence length {seqlen} must divide into 2 * world_size = "
                         f"{2 * world_size} equal chunks for the zigzag split")


def zigzag_split(x: torch.Tensor, world_size: int, rank: int, dim: int = 1) -> torch.Tensor:
    """Rank ``rank``'s slice of the whole sequence ``x`` (sequence along
    ``dim``): chunks ``rank`` and ``2·world_size − 1 − rank`` of 2·world_size
    equal chunks, concatenated (a new tensor)."""
    _check_split(x.shape[dim], world_size, "x")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    chunks = x.chunk(2 * world_size, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * world_size - 1 - rank]], dim=dim)


def zigzag_unsplit(slices: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """The whole sequence from every rank's slice (``zigzag_split``'s inverse),
    ``slices[r]`` being rank r's."""
    world_size = len(slices)
    halves = [s.chunk(2, dim=dim) for s in slices]
    return torch.cat([halves[r][0] for r in range(world_size)] +
                     [halves[r][1] for r in reversed(range(world_size))], dim=dim)


def _lengths(cu_seqlens: torch.Tensor) -> list[int]:
    bounds = cu_seqlens.tolist()
    return [b - a for a, b in zip(bounds[:-1], bounds[1:])]


def zigzag_cu_seqlens(cu_seqlens: torch.Tensor, world_size: int) -> torch.Tensor:
    """A rank's cu_seqlens (the same on every rank) for the zigzag split of a
    varlen batch whose cu_seqlens are given: every length divided by
    world_size (each must divide into 2 · world_size chunks)."""
    for b, length in enumerate(_lengths(cu_seqlens)):
        _check_split(length, world_size, f"cu_seqlens: sequence {b}")
    return torch.div(cu_seqlens, world_size, rounding_mode="floor").to(torch.int32)


def zigzag_split_varlen(x: torch.Tensor, cu_seqlens: torch.Tensor, world_size: int, rank: int,
                        dim: int = 0) -> torch.Tensor:
    """Rank ``rank``'s slice of a packed varlen batch ``x`` (rows along
    ``dim``, cu_seqlens the whole batch's): each sequence's zigzag slice,
    packed in order (a new tensor)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    zigzag_cu_seqlens(cu_seqlens, world_size)  # checks the lengths
    starts = cu_seqlens.tolist()[:-1]
    return torch.cat([zigzag_split(x.narrow(dim, start, length), world_size, rank, dim)
                      for start, length in zip(starts, _lengths(cu_seqlens))], dim=dim)


def zigzag_unsplit_varlen(slices: list[torch.Tensor], cu_seqlens: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """The whole packed batch from every rank's slice (``zigzag_split_varlen``'s
    inverse), ``slices[r]`` being rank r's and cu_seqlens the whole batch's."""
    world_size = len(slices)
    local = zigzag_cu_seqlens(cu_seqlens, world_size).tolist()
    return torch.cat([zigzag_unsplit([s.narrow(dim, a, b - a) for s in slices], dim)
                      for a, b in zip(local[:-1], local[1:])], dim=dim)


# --------------------------------------------------------------------------
# one rank's steps
# --------------------------------------------------------------------------


class _Varlen:
    """A rank's varlen layout (the same on every rank): its cu_seqlens and
    longest sequence, and, for the steps that take one chunk of each
    sequence, the first chunks' lengths (the keys' seqused_k) and the rows of
    the second chunks (gathered as queries, with their own cu_seqlens)."""

    def __init__(self, cu_seqlens: torch.Tensor, max_seqlen: int):
        self.cu_seqlens = cu_seqlens
        self.max_seqlen = max_seqlen
        lengths = _lengths(cu_seqlens)
        halves = [n // 2 for n in lengths]
        device = cu_seqlens.device
        self.halves = torch.tensor(halves, dtype=torch.int32, device=device)
        self.cu_halves = torch.tensor([0] + list(_cumsum(halves)), dtype=torch.int32, device=device)
        starts = cu_seqlens.tolist()[:-1]
        self.sequences = list(zip(starts, lengths))  # (first row, rows) of each
        self.second_halves = torch.cat(
            [torch.arange(a + h, a + n, device=device) for a, n, h in zip(starts, lengths, halves)]
            or [torch.zeros(0, dtype=torch.long, device=device)])
        self.max_half = max(halves, default=0)

    def args(self, queries_second_halves=False, keys_first_halves=False):
        """The kernels' varlen arguments for one step's block."""
        if queries_second_halves:
            cu_q, max_q = self.cu_halves, self.max_half
        else:
            cu_q, max_q = self.cu_seqlens, self.max_seqlen
        return dict(cu_seqlens_q=cu_q, cu_seqlens_k=self.cu_seqlens, max_seqlen_q=max_q, max_seqlen_k=self.max_seqlen,
                    seqused_k=self.halves if keys_first_halves else None)


def _cumsum(values):
    total = 0
    for v in values:
        total += v
        yield total


class _FlashtileKernels:
    """The per-block attention: flashtile's forward (out, lse) and its
    backward given the whole ring's out and lse, with the window (left,
    right) of the block (bottom-right aligned, as flash_attn's; (−1, 0) is
    causal). Tensors are (batch, rows, nheads, d) and lse (batch, nheads,
    rows); with varlen (the kernels' varlen arguments) batch is 1, the packed
    rows. Tests on the CPU put a reference in ``_KERNELS`` instead."""

    @staticmethod
    def fwd(q, k, v, softmax_scale, window, varlen):
        from . import _ops
        if varlen is None:
            out, lse, _ = _ops.fwd(q, k, v, softmax_scale, False, window_left=window[0], window_right=window[1])
            return out, lse
        out, lse, _ = _ops.fwd(q[0], k[0], v[0], softmax_scale, False, window_left=window[0],
                               window_right=window[1], **varlen)
        return out.unsqueeze(0), lse.unsqueeze(0)

    @staticmethod
    def bwd(dout, q, k, v, out, lse, softmax_scale, window, varlen):
        from . import _ops
        if varlen is None:
            return _ops.bwd(dout, q, k, v, out, lse, softmax_scale, False, window_left=window[0],
                            window_right=window[1])
        grads = _ops.bwd(dout[0], q[0], k[0], v[0], out[0], lse[0], softmax_scale, False, window_left=window[0],
                         window_right=window[1], **varlen)
        return tuple(g.unsqueeze(0) for g in grads)


_KERNELS = _FlashtileKernels


UNBOUNDED = (-1, -1)
CAUSAL = (-1, 0)


def _band_block(q_start: int, q_rows: int, k_start: int, k_rows: int, window):
    """The part of a (q_rows × k_rows) block that the window (left, right)
    lets anything through, its rows and keys at q_start and k_start of the
    whole sequence: (first row, rows, first key, keys, the block's
    bottom-right aligned (left, right)), or None. Rows that see none of the
    keys and keys that no row sees are cut off, which leaves both sides of
    the block's window non-negative (or unbounded)."""
    left, right = window
    delta = q_start - k_start  # row i sees key j iff i + delta − left <= j <= i + delta + right
    i_lo = max(0, -(delta + right)) if right >= 0 else 0
    i_hi = min(q_rows, k_rows - delta + left) if left >= 0 else q_rows
    if i_lo >= i_hi:
        return None
    j_lo = max(0, i_lo + delta - left) if left >= 0 else 0
    j_hi = min(k_rows, i_hi + delta + right) if right >= 0 else k_rows
    if j_lo >= j_hi:
        return None
    rows, keys = i_hi - i_lo, j_hi - j_lo
    delta += i_lo - j_lo
    offset = keys - rows  # the kernels' diagonal: row i's is key i + offset
    block_window = (offset - delta + left if left >= 0 else -1, delta + right - offset if right >= 0 else -1)
    return i_lo, rows, j_lo, keys, block_window


def _step_blocks(rank: int, source: int, seqlen: int, world_size: int, window, varlen: Optional[_Varlen] = None):
    """The (query rows, key rows, window, the kernels' varlen arguments)
    blocks that rank ``rank`` computes while holding rank ``source``'s keys
    (none when none of its queries sees them); rows are a slice or, varlen,
    an index of the packed rows. seqlen: a zigzag slice's length, two
    chunks (varlen: all its rows)."""
    everything = slice(0, seqlen)
    if varlen is not None:
        if window == UNBOUNDED or (window == CAUSAL and source == rank):
            return [(everything, everything, window, varlen.args())]
        if window != CAUSAL:
            # A window's blocks differ from sequence to sequence (they depend
            # on its chunks' length): each sequence's, as a batch of one.
            return [(_shift(q_rows, start), _shift(k_rows, start), block_window, None)
                    for start, rows in varlen.sequences
                    for q_rows, k_rows, block_window, _ in _step_blocks(rank, source, rows, world_size, window)]
        if source < rank:
            return [(everything, everything, UNBOUNDED, varlen.args(keys_first_halves=True))]
        return [(varlen.second_halves, everything, UNBOUNDED, varlen.args(queries_second_halves=True))]
    half = seqlen // 2
    if window == UNBOUNDED:
        return [(everything, everything, UNBOUNDED, None)]
    if window == CAUSAL:
        if source == rank:
            return [(everything, everything, CAUSAL, None)]
        if source < rank:
            return [(everything, slice(0, half), UNBOUNDED, None)]
        return [(slice(half, seqlen), everything, UNBOUNDED, None)]
    # Each of the slices' chunks at its place in the whole sequence.
    chunks = lambda r: ((0, r * half), (half, (2 * world_size - 1 - r) * half))  # noqa: E731
    blocks = []
    for q_local, q_start in chunks(rank):
        for k_local, k_start in chunks(source):
            block = _band_block(q_start, half, k_start, half, window)
            if block is not None:
                i, rows, j, keys, block_window = block
                blocks.append((slice(q_local + i, q_local + i + rows), slice(k_local + j, k_local + j + keys),
                               block_window, None))
    return blocks


def _shift(rows: slice, start: int) -> slice:
    return slice(rows.start + start, rows.stop + start)


def _merge(out_acc, lse_acc, out, lse):
    """out_acc, lse_acc (lse (batch, nheads, rows)) ← the softmax-weighted
    merge of themselves with a partial (out, lse) over the same rows."""
    lse_new = torch.logaddexp(lse_acc, lse)
    empty = torch.isneginf(lse_new)  # no key seen by either: stays out 0, lse −inf
    w_acc = torch.where(empty, 0.0, torch.exp(lse_acc - lse_new)).transpose(1, 2).unsqueeze(-1)
    w_new = torch.where(empty, 0.0, torch.exp(lse - lse_new)).transpose(1, 2).unsqueeze(-1)
    out_acc.mul_(w_acc).add_(w_new * out.to(out_acc.dtype))
    lse_acc.copy_(lse_new)


def _acc_dtype(t: torch.Tensor) -> torch.dtype:
    """Accumulators in fp32 (float64 for float64 inputs, which only the
    CPU tests' stand-in kernels take)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


class _ForwardState:
    """One rank's forward: its queries, the keys it holds, the running merge.
    Tensors (batch, rows, nheads, d), lse (batch, nheads, rows); a varlen
    batch as batch 1."""

    def __init__(self, rank, q, k, v, varlen=None):
        self.rank = rank
        self.q = q
        self.kv = (k, v)
        self.varlen = varlen
        batch, seqlen, nheads, _ = q.shape
        self.out = torch.zeros(q.shape, dtype=_acc_dtype(q), device=q.device)
        self.lse = torch.full((batch, nheads, seqlen), float("-inf"), dtype=_acc_dtype(q), device=q.device)

    def step(self, source, world_size, softmax_scale, window):
        k, v = self.kv
        for q_rows, k_rows, block_window, varlen in _step_blocks(self.rank, source, self.q.shape[1], world_size,
                                                                 window, self.varlen):
            out, lse = _KERNELS.fwd(self.q[:, q_rows], k[:, k_rows], v[:, k_rows], softmax_scale, block_window,
                                    varlen)
            if isinstance(q_rows, slice):  # views: merged in place
                _merge(self.out[:, q_rows], self.lse[:, :, q_rows], out, lse)
            else:  # gathered rows: merged, then put back
                out_acc, lse_acc = self.out[:, q_rows], self.lse[:, :, q_rows]
                _merge(out_acc, lse_acc, out, lse)
                self.out[:, q_rows], self.lse[:, :, q_rows] = out_acc, lse_acc


class _BackwardState:
    """One rank's backward: its queries' gradient, and the keys it holds with
    their dK, dV accumulators (which travel with them)."""

    def __init__(self, rank, dout, q, k, v, out, lse, varlen=None):
        self.rank = rank
        self.dout, self.q, self.out, self.lse = dout, q, out, lse
        self.varlen = varlen
        self.kv = (k, v)
        self.dq = torch.zeros(q.shape, dtype=_acc_dtype(q), device=q.device)
        self.dkv = (torch.zeros(k.shape, dtype=_acc_dtype(k), device=k.device),
                    torch.zeros(v.shape, dtype=_acc_dtype(v), device=v.device))

    def step(self, source, world_size, softmax_scale, window):
        """This step's gradients: dq added here; a list of (key rows, dk, dv)
        returned for add_dkv, so that the held keys' accumulators may still
        be on their way while the kernels run."""
        k, v = self.kv
        partials = []
        for q_rows, k_rows, block_window, varlen in _step_blocks(self.rank, source, self.q.shape[1], world_size,
                                                                 window, self.varlen):
            dq, dk, dv = _KERNELS.bwd(self.dout[:, q_rows], self.q[:, q_rows], k[:, k_rows], v[:, k_rows],
                                      self.out[:, q_rows], self.lse[:, :, q_rows].contiguous(), softmax_scale,
                                      block_window, varlen)
            self.dq[:, q_rows] += dq
            partials.append((k_rows, dk, dv))
        return partials

    def add_dkv(self, partials):
        for k_rows, dk, dv in partials:
            self.dkv[0][:, k_rows] += dk
            self.dkv[1][:, k_rows] += dv


# --------------------------------------------------------------------------
# N virtual ranks in one process
# --------------------------------------------------------------------------


def _rotate(states, attribute):
    """Every state's `attribute` moves to the next rank's state (what one ring
    send and receive does)."""
    values = [getattr(s, attribute) for s in states]
    for r, s in enumerate(states):
        setattr(s, attribute, values[(r - 1) % len(states)])


def _simulated_forward(q_slices, k_slices, v_slices, softmax_scale, window, varlen):
    world_size = len(q_slices)
    states = [_ForwardState(r, q_slices[r], k_slices[r], v_slices[r], varlen) for r in range(world_size)]
    for step in range(world_size):
        for s in states:
            s.step((s.rank - step) % world_size, world_size, softmax_scale, window)
        if step + 1 < world_size:
            _rotate(states, "kv")
    return [s.out.to(q_slices[0].dtype) for s in states], [s.lse for s in states]


def _simulated_backward(dout_slices, q_slices, k_slices, v_slices, out_slices, lse_slices, softmax_scale, window,
                        varlen):
    world_size = len(q_slices)
    states = [_BackwardState(r, dout_slices[r], q_slices[r], k_slices[r], v_slices[r], out_slices[r], lse_slices[r],
                             varlen)
              for r in range(world_size)]
    for step in range(world_size):
        for s in states:
            s.add_dkv(s.step((s.rank - step) % world_size, world_size, softmax_scale, window))
        if step + 1 < world_size:
            _rotate(states, "kv")
        _rotate(states, "dkv")  # after the last step: back to their owners
    return ([s.dq.to(q_slices[0].dtype) for s in states], [s.dkv[0].to(k_slices[0].dtype) for s in states],
            [s.dkv[1].to(v_slices[0].dtype) for s in states])


class _SimulatedSplit:
    """How the simulation cuts the whole batch into the ranks' slices and
    puts them back: (batch, seqlen, nheads, d) along the sequence, or a
    packed varlen batch (total, nheads, d) sequence by sequence, each rank's
    slice then as batch 1; lse (batch, nheads, seqlen) or (nheads, total)."""

    def __init__(self, world_size, cu_seqlens=None, max_seqlen=0):
        self.world_size = world_size
        self.cu_seqlens = cu_seqlens
        self.varlen = None
        if cu_seqlens is not None:
            self.varlen = _Varlen(zigzag_cu_seqlens(cu_seqlens, world_size), max_seqlen // world_size)

    def split(self, t, lse=False):
        n = self.world_size
        if self.cu_seqlens is None:
            return [zigzag_split(t, n, r, dim=2 if lse else 1) for r in range(n)]
        return [zigzag_split_varlen(t, self.cu_seqlens, n, r, dim=1 if lse else 0).unsqueeze(0) for r in range(n)]

    def unsplit(self, slices, lse=False):
        if self.cu_seqlens is None:
            return zigzag_unsplit(slices, dim=2 if lse else 1)
        return zigzag_unsplit_varlen([s[0] for s in slices], self.cu_seqlens, dim=1 if lse else 0)


class _SimulatedRingFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, window, split):
        outs, lses = _simulated_forward(*(split.split(t) for t in (q, k, v)), softmax_scale, window, split.varlen)
        out = split.unsplit(outs)
        lse = split.unsplit(lses, lse=True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (softmax_scale, window, split)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        softmax_scale, window, split = ctx.options
        dqs, dks, dvs = _simulated_backward(*(split.split(t) for t in (dout, q, k, v, out)),
                                            split.split(lse, lse=True), softmax_scale, window, split.varlen)
        return split.unsplit(dqs), split.unsplit(dks), split.unsplit(dvs), None, None, None


def _check_inputs(q, k, v, softmax_scale):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be (batch, seqlen, nheads, head_dim), got shape {tuple(t.shape)}; "
                             "for a packed varlen batch use the varlen function (ring_flash_attn_varlen_func)")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"q and k must hold the same slice of the sequence, got seqlen {q.shape[1]} and "
                         f"{k.shape[1]}")
    if q.shape[2] % k.shape[2] != 0:
        raise ValueError(f"q's heads ({q.shape[2]}) must be a multiple of k's ({k.shape[2]})")
    return softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])


def _check_varlen_inputs(q, k, v, cu_seqlens, softmax_scale):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be a packed varlen batch (total, nheads, head_dim), got shape "
                             f"{tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must hold the same rows, got {q.shape[0]} and {k.shape[0]}")
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"q's heads ({q.shape[1]}) must be a multiple of k's ({k.shape[1]})")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1:
        raise ValueError("cu_seqlens must be a 1-D int32 tensor")
    if int(cu_seqlens[-1]) != q.shape[0]:
        raise ValueError(f"cu_seqlens must end at q's rows ({q.shape[0]}), got {int(cu_seqlens[-1])}")
    return softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])


def _window(causal: bool, window_size) -> tuple[int, int]:
    """flash_attn's (left, right) with causal folded in (right = 0); any
    2-element sequence of ints, negative meaning unbounded."""
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise ValueError(f"window_size must be a pair of ints, got {window_size!r}") from None
    left, right = max(left, -1), max(right, -1)
    return (left, 0) if causal else (left, right)


def simulate_ring_flash_attn(q, k, v, world_size: int, softmax_scale: Optional[float] = None, causal: bool = False,
                             window_size=(-1, -1)):
    """The ring's attention over the whole sequence, run for ``world_size``
    virtual ranks in one process: each rank's zigzag slice, the ring's
    steps in turn, the slices put back together. Returns (out, lse) as
    flash_attn_func with return_attn_probs=True would (lse (batch, nheads,
    seqlen), fp32); differentiable in q, k and v (the ring's backward)."""
    softmax_scale = _check_inputs(q, k, v, softmax_scale)
    _check_split(q.shape[1], world_size, "q")
    return _SimulatedRingFunction.apply(q, k, v, softmax_scale, _window(causal, window_size),
                                        _SimulatedSplit(world_size))


def simulate_ring_flash_attn_varlen(q, k, v, cu_seqlens: torch.Tensor, max_seqlen: int, world_size: int,
                                    softmax_scale: Optional[float] = None, causal: bool = False,
                                    window_size=(-1, -1)):
    """simulate_ring_flash_attn for a packed varlen batch (total, nheads,
    head_dim) with the whole batch's cu_seqlens (int32) and longest sequence:
    each sequence zigzag-split across ``world_size`` virtual ranks. Returns
    (out, lse (nheads, total), fp32), as flash_attn_varlen_func would."""
    softmax_scale = _check_varlen_inputs(q, k, v, cu_seqlens, softmax_scale)
    return _SimulatedRingFunction.apply(q, k, v, softmax_scale, _window(causal, window_size),
                                        _SimulatedSplit(world_size, cu_seqlens, max_seqlen))


# --------------------------------------------------------------------------
# the ranks of a process group
# --------------------------------------------------------------------------


class _RingComm:
    """Sends to the next rank and receives from the previous one of a process
    group, asynchronously (batch_isend_irecv), so that a step's kernels run
    while the next step's keys travel."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.world_size) if group else \
            (self.rank + 1) % self.world_size
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.world_size) if group else \
            (self.rank - 1) % self.world_size

    def start(self, tensors):
        """Starts sending `tensors` on and receiving their successors; returns
        (received tensors, what wait() takes)."""
        sent = [t.contiguous() for t in tensors]
        received = [torch.empty_like(t) for t in sent]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in sent]
        ops += [dist.P2POp(dist.irecv, r, self.prev, self.group) for r in received]
        # The sent tensors (copies, where a slice was not contiguous) stay
        # referenced until the transfer is waited for.
        return received, (dist.batch_isend_irecv(ops), sent)

    @staticmethod
    def wait(pending):
        requests, _sent = pending
        for request in requests:
            request.wait()


class _RingFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, window, group, varlen):
        comm = _RingComm(group)
        state = _ForwardState(comm.rank, q, k, v, varlen)
        for step in range(comm.world_size):
            pending = None
            if step + 1 < comm.world_size:
                received, pending = comm.start(list(state.kv))
            state.step((comm.rank - step) % comm.world_size, comm.world_size, softmax_scale, window)
            if pending is not None:
                comm.wait(pending)
                state.kv = tuple(received)
        out = state.out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, state.lse)
        ctx.options = (softmax_scale, window, group, varlen)
        ctx.mark_non_differentiable(state.lse)
        return out, state.lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        softmax_scale, window, group, varlen = ctx.options
        comm = _RingComm(group)
        state = _BackwardState(comm.rank, dout, q, k, v, out, lse, varlen)
        pending_dkv = None  # the held keys' accumulators, on their way from the previous rank
        for step in range(comm.world_size):
            pending_kv = None
            if step + 1 < comm.world_size:
                received_kv, pending_kv = comm.start(list(state.kv))
            partial = state.step((comm.rank - step) % comm.world_size, comm.world_size, softmax_scale, window)
            if pending_dkv is not None:
                comm.wait(pending_dkv)
                state.dkv = tuple(received_dkv)
            state.add_dkv(partial)
            # On with the keys to the next rank (after the last step: back to
            # their owner).
            received_dkv, pending_dkv = comm.start(list(state.dkv))
            if pending_kv is not None:
                comm.wait(pending_kv)
                state.kv = tuple(received_kv)
        comm.wait(pending_dkv)
        state.dkv = tuple(received_dkv)
        return state.dq.to(q.dtype), state.dkv[0].to(k.dtype), state.dkv[1].to(v.dtype), None, None, None, None


def ring_flash_attn_func(q, k, v, softmax_scale: Optional[float] = None, causal: bool = False, group=None,
                         return_lse: bool = False, window_size=(-1, -1)):
    """Attention over a sequence split across the ranks of ``group`` (the
    default process group when None): q, k, v are this rank's zigzag slice
    (``zigzag_split``), (batch, seqlen / world_size, nheads, head_dim); the
    result is this rank's slice of the output (and with return_lse=True its
    lse, (batch, nheads, rows), fp32). window_size: flash_attn's sliding
    window over the whole sequence. Differentiable in q, k and v."""
    softmax_scale = _check_inputs(q, k, v, softmax_scale)
    if q.shape[1] % 2 != 0:
        raise ValueError(f"q: a zigzag slice holds two equal chunks, got seqlen {q.shape[1]}")
    if not dist.is_initialized():
        raise RuntimeError("ring_flash_attn_func needs torch.distributed initialized (init_process_group)")
    out, lse = _RingFunction.apply(q, k, v, softmax_scale, _window(causal, window_size), group, None)
    return (out, lse) if return_lse else out


def ring_flash_attn_varlen_func(q, k, v, cu_seqlens: torch.Tensor, max_seqlen: int,
                                softmax_scale: Optional[float] = None, causal: bool = False, group=None,
                                return_lse: bool = False, window_size=(-1, -1)):
    """ring_flash_attn_func for a packed varlen batch: q, k, v are this rank's
    slice (``zigzag_split_varlen``), (rows, nheads, head_dim); cu_seqlens
    (int32) and max_seqlen are this rank's (``zigzag_cu_seqlens`` of the
    whole batch's; every length even: two chunks). window_size: flash_attn's
    sliding window within each sequence. Returns this rank's rows of the
    output (and with return_lse=True its lse, (nheads, rows), fp32)."""
    softmax_scale = _check_varlen_inputs(q, k, v, cu_seqlens, softmax_scale)
    odd = [n for n in _lengths(cu_seqlens) if n % 2]
    if odd:
        raise ValueError(f"cu_seqlens: a zigzag slice holds two equal chunks of each sequence, got length {odd[0]}")
    if not dist.is_initialized():
        raise RuntimeError("ring_flash_attn_varlen_func needs torch.distributed initialized (init_process_group)")
    out, lse = _RingFunction.apply(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), softmax_scale,
                                   _window(causal, window_size), group, _Varlen(cu_seqlens, max_seqlen))
    return (out[0], lse[0]) if return_lse else out[0]
