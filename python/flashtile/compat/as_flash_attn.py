"""Importing this module runs :func:`flashtile.compat.install`: ``import
flash_attn`` then gives flashtile's compatibility layer. It exists for
``python -m pytest -p flashtile.compat.as_flash_attn``, which runs a test
suite written for flash_attn against flashtile."""

from . import install

install()
