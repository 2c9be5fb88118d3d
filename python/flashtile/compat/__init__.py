"""flash_attn 2.x's Python API on flashtile, module for module: code written
for flash_attn runs on flashtile by importing from here instead
(``from flashtile.compat import flash_attn_func``), or unchanged after
:func:`install`, which makes ``import flash_attn`` (and its submodules
``flash_attn_interface``, ``bert_padding``, ``layers.rotary``) resolve to
these modules for the rest of the process. ``python -m pytest -p
flashtile.compat.as_flash_attn`` does the same for a test run.

What differs from flash_attn, and why, is in docs/compatibility.md.
"""

from __future__ import annotations

import importlib
import sys

from .flash_attn_interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)

# The flash_attn release whose API this mirrors, tagged as flashtile's, for
# code that compares flash_attn.__version__.
__version__ = "2.8.3+flashtile"

__all__ = [
    "__version__",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "install",
]

# flash_attn's module names -> these modules.
_ALIASES = {
    "flash_attn": __name__,
    "flash_attn.flash_attn_interface": __name__ + ".flash_attn_interface",
    "flash_attn.bert_padding": __name__ + ".bert_padding",
    "flash_attn.layers": __name__ + ".layers",
    "flash_attn.layers.rotary": __name__ + ".layers.rotary",
    "flash_attn_2_cuda": __name__ + ".flash_attn_2_cuda",
}


def install() -> None:
    """Make ``import flash_attn`` and its submodules above give flashtile's
    modules from now on in this process. Raises RuntimeError if a real
    flash_attn (or FlashAttention-4, also named flash_attn) is already
    imported: the two cannot share the name, and replacing modules that
    other code already holds would mix them."""
    for alias, target in _ALIASES.items():
        present = sys.modules.get(alias)
        if present is not None and present.__name__ != target:
            raise RuntimeError(f"{alias} is already imported (from {getattr(present, '__file__', '?')}); "
                               "call flashtile.compat.install() before anything imports flash_attn")
    for alias, target in _ALIASES.items():
        sys.modules[alias] = importlib.import_module(target)
