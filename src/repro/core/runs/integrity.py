"""A checkpoint's content digest: a SHA-256 over every value it holds, stored in it, so that a
flipped bit (bit rot, a torn copy between file systems) is found when the file is read rather
than trained on.

The digest covers the content, not the file's bytes: tensors by dtype, shape and raw bytes,
plain values by type and `repr`, containers in their order. So it reads the same from a
memory-mapped load and after `torch.save` has laid the file out its own way.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

KEY = "content_sha256"


def content_sha256(state: dict[str, Any]) -> str:
    """The digest of everything in `state` but the digest itself."""
    digest = hashlib.sha256()
    _feed(digest, {key: value for key, value in state.items() if key != KEY})
    return digest.hexdigest()


def sealed(state: dict[str, Any]) -> dict[str, Any]:
    """`state` with its digest added (or renewed)."""
    return {**state, KEY: content_sha256(state)}


def intact(state: dict[str, Any]) -> bool:
    """Whether `state` still holds what was sealed into it."""
    return state.get(KEY) == content_sha256(state)


def _feed(digest: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        digest.update(f"tensor {value.dtype} {tuple(value.shape)}\n".encode())
        digest.update(value.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    elif isinstance(value, dict):
        digest.update(f"dict {len(value)}\n".encode())
        for key, item in value.items():
            _feed(digest, key)
            _feed(digest, item)
    elif isinstance(value, list | tuple):
        digest.update(f"{type(value).__name__} {len(value)}\n".encode())
        for item in value:
            _feed(digest, item)
    else:
        digest.update(f"{type(value).__name__} {value!r}\n".encode())
