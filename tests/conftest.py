"""Shared pytest fixtures, and the forced shared-memory budget:
FLASHTILE_TEST_SMEM_BUDGET=99 (or 163) runs the whole suite on the tiles of
GPUs with that much shared memory per block, on any GPU that has at least
as much (tests/README.md)."""

import os
import zlib

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    """Seed torch from the test's id: fresh inputs for every test and
    parametrization, yet the same inputs when a failing test is rerun."""
    seed = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(seed)
    return seed


def pytest_configure(config):
    budget = os.environ.get("FLASHTILE_TEST_SMEM_BUDGET")
    if budget:
        from flashtile import _C
        from kernel_names import budget_tiles_run_here

        if torch.cuda.is_available() and not budget_tiles_run_here(int(budget)):
            pytest.exit(f"FLASHTILE_TEST_SMEM_BUDGET={budget}: this build compiles those tiles for other GPUs than "
                        "this H100/H200 only; build with FLASHTILE_CUDA_ARCHS=90a (tests/README.md)", returncode=4)
        _C.limit_smem_budget(int(budget))
