"""Which CUDA kernels a call launched, by name (torch's profiler), for the
tests that check a dispatch decision: which tile or which kernel ran."""

import contextlib
import os
import re

import torch

from flashtile import _C


def cuda_kernel_names(fn):
    """fn()'s result and the names of the CUDA kernels it launched."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        result = fn()
        torch.cuda.synchronize()
    return result, [event.name for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA]


def fwd_tile_of(names):
    """(kBlockM, kBlockN) of the forward kernel among `names`, from its
    FwdTraits<head_dim, kBlockM, kBlockN, ...> argument (demangled or not)."""
    for name in names:
        if "fwd_kernel" in name:
            found = (re.search(r"FwdTraits<\d+, (\d+), (\d+),", name)
                     or re.search(r"FwdTraitsILi\d+ELi(\d+)ELi(\d+)E", name))
            assert found, name
            return int(found[1]), int(found[2])
    raise AssertionError(f"no forward kernel among {names}")


def forced_smem_budget():
    """The KB of FLASHTILE_TEST_SMEM_BUDGET (conftest.py), or None."""
    budget = os.environ.get("FLASHTILE_TEST_SMEM_BUDGET")
    return int(budget) if budget else None


def kernels_with_sm90_code():
    """The built_kernels() entries with code for compute capability 9.0."""
    without = {tuple(entry) for entry in _C.kernels_without_sm90_code()}
    return [tuple(entry) for entry in _C.built_kernels() if tuple(entry) not in without]


def sm90_code_required():
    """Whether the dispatch runs only kernels with code for this GPU's sm90:
    on an H100/H200 with a build that has any (one with 90a; flashtile.hpp's
    sm90_code_required). A build without 90a runs its sm80 kernels there on
    the driver's JIT compilation of their PTX."""
    return torch.cuda.get_device_capability() == (9, 0) and bool(kernels_with_sm90_code())


def sm80_forward_runs_here():
    """Whether a forward with the dispatch limited to sm80 can run on this
    GPU: anywhere but on an H100/H200 with a build that compiled the sm80
    forward for its other archs only (FLASHTILE_SM80_ON_SM90 off, the
    default: its wgmma forward takes every call there)."""
    return not sm90_code_required() or any(d == "fwd" and arch == "sm80" for d, arch, *_ in kernels_with_sm90_code())


def budget_tiles_run_here(kb):
    """Whether the sm80 path's tiles for kb KB of shared memory (_C.limit_smem_budget)
    run on this GPU: anywhere but on an H100/H200 with a build that compiled
    them for its other archs only (a build with 80 and 90a), where the
    dispatch runs no kernel without sm90 code."""
    if not sm90_code_required():
        return True
    return any(tuned == kb and sm90_code for *_, tuned, sm90_code in _C.built_smem_budgets())


@contextlib.contextmanager
def sm80_kernels_only():
    """The dispatch limited to the sm80 (mma.sync) kernels, on any GPU: for
    tests of those kernels' own tiles, or that compare them bit for bit. The
    tests that use it run a forward: skipped where sm80_forward_runs_here()
    is False."""
    import pytest

    if not sm80_forward_runs_here():
        pytest.skip("this build compiles the sm80 forward for other GPUs than this H100/H200 only "
                    "(FLASHTILE_SM80_ON_SM90=ON builds it for sm90a too)")
    _C.limit_dispatch_arch("sm80")
    try:
        yield
    finally:
        _C.limit_dispatch_arch("sm90")


def sm90_built(direction, variant="plain"):
    """The (head_dim, dtype name) pairs with an sm90 (wgmma) kernel of
    direction "fwd" or "bwd" and variant "plain" or "scoremod" in this build."""
    return tuple(sorted({(int(hd), str(dn)) for d, arch, hd, dn, v in _C.built_kernels()
                         if d == direction and arch == "sm90" and v == variant}))


def require_sm90(direction):
    """Skip unless this GPU runs sm90a code and the build has an sm90 kernel
    of direction "fwd" or "bwd"."""
    import pytest

    what = {"fwd": "forward", "bwd": "backward"}[direction]
    if forced_smem_budget() is not None:
        pytest.skip(f"FLASHTILE_TEST_SMEM_BUDGET={forced_smem_budget()} dispatches no wgmma {what}")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"the wgmma {what} runs on compute capability 9.0, this GPU is "
                    f"{torch.cuda.get_device_capability()}")
    if not sm90_built(direction):
        pytest.skip(f"this build has no sm90 {what} kernel (FLASHTILE_CUDA_ARCHS without 90a)")


def require_sm80_plain_here(direction, head_dim):
    """Skip where this GPU cannot run the sm80 plain kernels of direction and
    head_dim: an H100/H200 with a build that compiled them for its other
    archs only or, with 90a alone, left them out (FLASHTILE_SM80_ON_SM90;
    in the backward the scoremod ones run in their place)."""
    import pytest

    if not sm90_code_required():
        return
    here = {(d, int(hd)) for d, arch, hd, _dt, variant in kernels_with_sm90_code()
            if arch == "sm80" and variant == "plain"}
    if (direction, head_dim) not in here:
        pytest.skip(f"the sm80 plain {direction} of d{head_dim} is not built for sm90 here "
                    "(FLASHTILE_SM80_ON_SM90=ON builds it)")


def require_short_fwd_tile():
    """Skip where the d64 forward has no short-key tile: on the 99 KB tiles
    (FLASHTILE_TEST_SMEM_BUDGET=99; sm80/fwd_traits.hpp's kFwdShortTile),
    or where the sm80 plain d64 forward cannot run here."""
    import pytest

    if forced_smem_budget() == 99:
        pytest.skip("FLASHTILE_TEST_SMEM_BUDGET=99: 99 KB GPUs run no short-key d64 forward tile")
    require_sm80_plain_here("fwd", 64)
