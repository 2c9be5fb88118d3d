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

``simulate_ring_flash_attn`` runs the same steps for N virtual ranks in one
process (the slices in a loop, no communication), which is how the tests
check the ring's exactness on one GPU.

Fixed-length batches (batch, seqlen, nheads, head_dim), MQA/GQA, causal or
not; varlen batches and sliding windows are not taken yet (ValueError).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.distributed as dist

__all__ = ["ring_flash_attn_func", "simulate_ring_flash_attn", "zigzag_split", "zigzag_unsplit"]


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


# --------------------------------------------------------------------------
# one rank's steps
# --------------------------------------------------------------------------


class _FlashtileKernels:
    """The per-step attention: flashtile's forward (out, lse) and its backward
    given the whole ring's out and lse (tests on the CPU put a reference in
    ``_KERNELS`` instead)."""

    @staticmethod
    def fwd(q, k, v, softmax_scale, causal):
        from . import _ops
        out, lse, _ = _ops.fwd(q, k, v, softmax_scale, causal)
        return out, lse

    @staticmethod
    def bwd(dout, q, k, v, out, lse, softmax_scale, causal):
        from . import _ops
        return _ops.bwd(dout, q, k, v, out, lse, softmax_scale, causal)


_KERNELS = _FlashtileKernels


def _step_slices(rank: int, source: int, seqlen: int, causal: bool):
    """(query rows, key rows, causal) that rank ``rank`` computes while holding
    rank ``source``'s keys, or None when none of its queries sees them."""
    everything = slice(0, seqlen)
    if not causal:
        return everything, everything, False
    half = seqlen // 2
    if source == rank:
        return everything, everything, True
    if source < rank:
        return everything, slice(0, half), False
    return slice(half, seqlen), everything, False


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
    """One rank's forward: its queries, the keys it holds, the running merge."""

    def __init__(self, rank, q, k, v):
        self.rank = rank
        self.q = q
        self.kv = (k, v)
        batch, seqlen, nheads, _ = q.shape
        self.out = torch.zeros(q.shape, dtype=_acc_dtype(q), device=q.device)
        self.lse = torch.full((batch, nheads, seqlen), float("-inf"), dtype=_acc_dtype(q), device=q.device)

    def step(self, source, softmax_scale, causal):
        rows = _step_slices(self.rank, source, self.q.shape[1], causal)
        if rows is None:
            return
        q_rows, k_rows, step_causal = rows
        k, v = self.kv
        out, lse = _KERNELS.fwd(self.q[:, q_rows], k[:, k_rows], v[:, k_rows], softmax_scale, step_causal)
        _merge(self.out[:, q_rows], self.lse[:, :, q_rows], out, lse)


class _BackwardState:
    """One rank's backward: its queries' gradient, and the keys it holds with
    their dK, dV accumulators (which travel with them)."""

    def __init__(self, rank, dout, q, k, v, out, lse):
        self.rank = rank
        self.dout, self.q, self.out, self.lse = dout, q, out, lse
        self.kv = (k, v)
        self.dq = torch.zeros(q.shape, dtype=_acc_dtype(q), device=q.device)
        self.dkv = (torch.zeros(k.shape, dtype=_acc_dtype(k), device=k.device),
                    torch.zeros(v.shape, dtype=_acc_dtype(v), device=v.device))

    def step(self, source, softmax_scale, causal):
        """This step's gradients: dq added here; (key rows, dk, dv) returned
        for add_dkv, or None, so that the held keys' accumulators may still
        be on their way while the kernels run."""
        rows = _step_slices(self.rank, source, self.q.shape[1], causal)
        if rows is None:
            return None
        q_rows, k_rows, step_causal = rows
        k, v = self.kv
        dq, dk, dv = _KERNELS.bwd(self.dout[:, q_rows], self.q[:, q_rows], k[:, k_rows], v[:, k_rows],
                                  self.out[:, q_rows], self.lse[:, :, q_rows].contiguous(), softmax_scale,
                                  step_causal)
        self.dq[:, q_rows] += dq
        return k_rows, dk, dv

    def add_dkv(self, partial):
        if partial is not None:
            k_rows, dk, dv = partial
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


def _simulated_forward(q_slices, k_slices, v_slices, softmax_scale, causal):
    world_size = len(q_slices)
    states = [_ForwardState(r, q_slices[r], k_slices[r], v_slices[r]) for r in range(world_size)]
    for step in range(world_size):
        for s in states:
            s.step((s.rank - step) % world_size, softmax_scale, causal)
        if step + 1 < world_size:
            _rotate(states, "kv")
    return [s.out.to(q_slices[0].dtype) for s in states], [s.lse for s in states]


def _simulated_backward(dout_slices, q_slices, k_slices, v_slices, out_slices, lse_slices, softmax_scale, causal):
    world_size = len(q_slices)
    states = [_BackwardState(r, dout_slices[r], q_slices[r], k_slices[r], v_slices[r], out_slices[r], lse_slices[r])
              for r in range(world_size)]
    for step in range(world_size):
        for s in states:
            s.add_dkv(s.step((s.rank - step) % world_size, softmax_scale, causal))
        if step + 1 < world_size:
            _rotate(states, "kv")
        _rotate(states, "dkv")  # after the last step: back to their owners
    return ([s.dq.to(q_slices[0].dtype) for s in states], [s.dkv[0].to(k_slices[0].dtype) for s in states],
            [s.dkv[1].to(v_slices[0].dtype) for s in states])


class _SimulatedRingFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, world_size, softmax_scale, causal):
        split = [[zigzag_split(t, world_size, r) for r in range(world_size)] for t in (q, k, v)]
        outs, lses = _simulated_forward(*split, softmax_scale, causal)
        out = zigzag_unsplit(outs)
        lse = zigzag_unsplit(lses, dim=2)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (world_size, softmax_scale, causal)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        world_size, softmax_scale, causal = ctx.options
        split = [[zigzag_split(t, world_size, r) for r in range(world_size)] for t in (dout, q, k, v, out)]
        lse_slices = [zigzag_split(lse, world_size, r, dim=2) for r in range(world_size)]
        dqs, dks, dvs = _simulated_backward(*split, lse_slices, softmax_scale, causal)
        return zigzag_unsplit(dqs), zigzag_unsplit(dks), zigzag_unsplit(dvs), None, None, None


def _check_inputs(q, k, v, softmax_scale):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be (batch, seqlen, nheads, head_dim), got shape {tuple(t.shape)}; "
                             "varlen batches are not taken by the ring yet")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"q and k must hold the same slice of the sequence, got seqlen {q.shape[1]} and "
                         f"{k.shape[1]}")
    if q.shape[2] % k.shape[2] != 0:
        raise ValueError(f"q's heads ({q.shape[2]}) must be a multiple of k's ({k.shape[2]})")
    return softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])


def simulate_ring_flash_attn(q, k, v, world_size: int, softmax_scale: Optional[float] = None, causal: bool = False):
    """The ring's attention over the whole sequence, run for ``world_size``
    virtual ranks in one process: each rank's zigzag slice, the ring's
    steps in turn, the slices put back together. Returns (out, lse) as
    flash_attn_func with return_attn_probs=True would (lse (batch, nheads,
    seqlen), fp32); differentiable in q, k and v (the ring's backward)."""
    softmax_scale = _check_inputs(q, k, v, softmax_scale)
    _check_split(q.shape[1], world_size, "q")
    return _SimulatedRingFunction.apply(q, k, v, world_size, softmax_scale, causal)


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
    def forward(ctx, q, k, v, softmax_scale, causal, group):
        comm = _RingComm(group)
        state = _ForwardState(comm.rank, q, k, v)
        for step in range(comm.world_size):
            pending = None
            if step + 1 < comm.world_size:
                received, pending = comm.start(list(state.kv))
            state.step((comm.rank - step) % comm.world_size, softmax_scale, causal)
            if pending is not None:
                comm.wait(pending)
                state.kv = tuple(received)
        out = state.out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, state.lse)
        ctx.options = (softmax_scale, causal, group)
        ctx.mark_non_differentiable(state.lse)
        return out, state.lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        softmax_scale, causal, group = ctx.options
        comm = _RingComm(group)
        state = _BackwardState(comm.rank, dout, q, k, v, out, lse)
        pending_dkv = None  # the held keys' accumulators, on their way from the previous rank
        for step in range(comm.world_size):
            pending_kv = None
            if step + 1 < comm.world_size:
                received_kv, pending_kv = comm.start(list(state.kv))
            partial = state.step((comm.rank - step) % comm.world_size, softmax_scale, causal)
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
        return state.dq.to(q.dtype), state.dkv[0].to(k.dtype), state.dkv[1].to(v.dtype), None, None, None


def ring_flash_attn_func(q, k, v, softmax_scale: Optional[float] = None, causal: bool = False, group=None,
                         return_lse: bool = False):
    """Attention over a sequence split across the ranks of ``group`` (the
    default process group when None): q, k, v are this rank's zigzag slice
    (``zigzag_split``), (batch, seqlen / world_size, nheads, head_dim); the
    result is this rank's slice of the output (and with return_lse=True its
    lse, (batch, nheads, rows), fp32). Differentiable in q, k and v."""
    softmax_scale = _check_inputs(q, k, v, softmax_scale)
    if q.shape[1] % 2 != 0:
        raise ValueError(f"q: a zigzag slice holds two equal chunks, got seqlen {q.shape[1]}")
    if not dist.is_initialized():
        raise RuntimeError("ring_flash_attn_func needs torch.distributed initialized (init_process_group)")
    out, lse = _RingFunction.apply(q, k, v, softmax_scale, causal, group)
    return (out, lse) if return_lse else out
