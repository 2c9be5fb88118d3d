"""``flash_attn.layers.rotary``: flashtile's rotary embedding (flashtile.rotary)
under flash_attn's module name."""

from ...rotary import *  # noqa: F401,F403
from ...rotary import __all__  # noqa: F401
