"""Frames: what an environment's optional `render()` shows, kept small enough to log.

An env may offer `render()`, returning an RGB image (an `H x W x 3` uint8
array, e.g. minigrid's), PNG bytes (a browser screenshot) or text (an
inventory). With `tracking.frames: N` the rollout engine calls it after the
reset and after every step of N episodes per update and per evaluation, and
keeps each frame on the trajectory as a `data:image/png;base64,...` URI or as
text. Images are shrunk to at most `MAX_SIDE` pixels a side; a frame that is
still over `MAX_BYTES` is replaced by a note, so logged episodes stay bounded.
"""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

MAX_SIDE = 256
"""Largest width or height of a kept image frame, in pixels."""
MAX_BYTES = 300_000
"""Largest encoded frame kept; a larger one becomes a note."""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DATA_URI = "data:image/png;base64,"


def encode_frame(frame: Any) -> str | None:
    """A frame as a PNG data URI or text; None when there is nothing to show."""
    if frame is None:
        return None
    if isinstance(frame, str):
        return _bounded(frame)
    if isinstance(frame, bytes | bytearray):
        if not bytes(frame).startswith(PNG_SIGNATURE):
            return "(a frame that is not a PNG image)"
        return _bounded(DATA_URI + base64.b64encode(bytes(frame)).decode("ascii"))
    return _bounded(DATA_URI + base64.b64encode(png_bytes(frame)).decode("ascii"))


def _bounded(text: str) -> str:
    if len(text) <= MAX_BYTES:
        return text
    return f"(frame of {len(text)} bytes left out: over {MAX_BYTES})"


def png_bytes(image: Any) -> bytes:
    """An RGB (or grey) uint8 image as PNG, every `step`-th pixel when larger than MAX_SIDE."""
    import numpy as np

    pixels = np.asarray(image)
    if pixels.ndim == 2:
        pixels = np.repeat(pixels[:, :, None], 3, axis=2)
    if pixels.ndim != 3 or pixels.shape[2] not in (3, 4):
        raise ValueError(f"a frame image is H x W x 3 (or 4), not {pixels.shape}")
    step = -(-max(pixels.shape[:2]) // MAX_SIDE)  # ceil: the smallest stride that fits
    pixels = np.ascontiguousarray(pixels[::step, ::step, :3].astype(np.uint8))
    height, width = pixels.shape[:2]
    rows = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))  # filter 0 per row

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        PNG_SIGNATURE
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows, 6))
        + chunk(b"IEND", b"")
    )
