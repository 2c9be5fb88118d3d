"""flashtile plugged into other libraries' attention interfaces: ``transformers``."""
