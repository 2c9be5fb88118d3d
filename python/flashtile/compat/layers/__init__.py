"""Plain-torch counterparts of flash_attn's ``flash_attn.layers`` modules."""
