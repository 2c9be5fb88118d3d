"""Which CUDA kernels a call launched, by name (torch's profiler), for the
tests that check a dispatch decision: which tile or which kernel ran."""

import contextlib
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


@contextlib.contextmanager
def sm80_kernels_only():
    """The dispatch limited to the sm80 (mma.sync) kernels, on any GPU: for
    tests of those kernels' own tiles, or that compare them bit for bit."""
    _C.limit_dispatch_arch("sm80")
    try:
        yield
    finally:
        _C.limit_dispatch_arch("sm90")
