"""open_clip models behind the Encoder interface (being split into modules; see encoder.py)."""

from .encoder import CONFIG_FILE, HF_HUB, LOCAL_DIR, PREFIX, OpenClipEncoder, OpenClipSpec, is_open_clip_name, parse_spec

__all__ = ["OpenClipEncoder", "OpenClipSpec", "PREFIX", "is_open_clip_name", "parse_spec"]
