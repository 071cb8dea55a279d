"""A model's text config: multimodal configs keep the language model's fields in a part."""

from __future__ import annotations

from typing import Any


def text_config(model: Any) -> Any:
    """`model.config`, or its text part (`get_text_config`) where it has one; None if no config."""
    config = getattr(model, "config", None)
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    return config
