"""The fast tier of the randomized differential tests (tests/fuzz.py): a
fixed set of cases drawn from one seed, each a test of its own.
FLASHTILE_FUZZ_SEED and FLASHTILE_FUZZ_CASES draw another set; a failure
names its case's seed, and ``python tests/fuzz.py --replay SEED`` reruns
it alone. The long tier (10,000 cases and more) runs from fuzz.py's command
line."""

import dataclasses
import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from flashtile import _C

import fuzz

SEED = int(os.environ.get("FLASHTILE_FUZZ_SEED", "20261201"))
CASES = int(os.environ.get("FLASHTILE_FUZZ_CASES", "150"))
BUILT = fuzz.built_combos()


@pytest.mark.parametrize("index", range(CASES))
def test_fuzz_case(index):
    if not BUILT:
        pytest.skip("this build has no head dim with both a forward and a backward kernel")
    seed = fuzz.case_seed(SEED, index)
    case = fuzz.draw_case(seed, BUILT)
    try:
        fuzz.run_case(case)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\ncase: {json.dumps(dataclasses.asdict(case))}\n"
                             f"rerun: python tests/fuzz.py --replay {seed}") from None
    finally:
        _C.limit_dispatch_arch("sm90")
