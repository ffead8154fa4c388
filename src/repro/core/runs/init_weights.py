"""`trainer.init_weights`: start the model from another run's weights (fine-tuning).

Every tensor of the file whose name and shape match the model's is copied in; the others
(a classifier for another number of classes) keep their seeded initial values and are
named in the run's summary, with the file's SHA-256, so the record says what the run
started from. Files are read with `weights_only=True`: a file holding code is refused.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import nn

from repro.core.errors import CheckpointError
from repro.core.guards import received
from repro.core.runs import checkpoint
from repro.core.runtime import distributed

log = logging.getLogger(__name__)

# What a state_dict saved from a wrapper has in front of every name: DistributedDataParallel,
# then torch.compile (outermost first).
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def load_on_every_rank(model: nn.Module, path: Path, dist: distributed.Context) -> dict[str, Any]:
    """`load_matching` on every rank, failing on all of them when it fails on one: a rank
    that stopped alone (the file missing on its node) would leave the others waiting."""
    loaded, problem = None, None
    try:
        loaded = load_matching(model, path)
    except CheckpointError as error:
        problem = str(error)
    for rank, failed in enumerate(distributed.gather(problem, dist)):
        if failed:
            raise CheckpointError(f"rank {rank}: {failed}" if dist.enabled else failed)
    assert loaded is not None
    return loaded


def load_matching(model: nn.Module, path: Path) -> dict[str, Any]:
    """Copy the matching tensors of `path` (a repro checkpoint's model weights, not its
    average, or a file holding a state_dict) into `model`; what was loaded, for the summary."""
    contents = _read(path)
    weights = _weights_in(path, contents)
    own = model.state_dict()
    matched = {
        name: tensor
        for name, tensor in weights.items()
        if name in own and own[name].shape == tensor.shape
    }
    if not matched:
        raise CheckpointError(
            f"trainer.init_weights={path}: none of its {len(weights)} tensors matches a name "
            "and shape of this model; point it at weights of the same architecture"
        )
    model.load_state_dict(matched, strict=False)
    kept = sorted(set(own) - set(matched))
    if kept:
        log.info("init_weights: %d tensors loaded; kept initial: %s", len(matched), ", ".join(kept))
    return {
        "path": str(path.resolve()),
        "sha256": hashlib.sha256(contents).hexdigest(),  # of the bytes loaded, read once
        "loaded": len(matched),
        "kept_initial": kept,
    }


def _read(path: Path) -> bytes:
    if not path.exists():
        raise CheckpointError(f"trainer.init_weights={path}: no such file")
    if path.is_dir():
        raise CheckpointError(f"trainer.init_weights={path}: not a file")
    try:
        return received.read_bytes(path, "checkpoint")
    except received.ReceivedFileError as error:
        raise CheckpointError(f"trainer.init_weights={error}") from None


def _weights_in(path: Path, contents: bytes) -> dict[str, torch.Tensor]:
    try:
        state = received.parse_checkpoint(contents, path)
    except received.ReceivedFileError as error:
        raise CheckpointError(f"trainer.init_weights={error}") from None
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"trainer.init_weights={path}: refused, not tensors saved by torch.save, or it "
            "holds other objects (loading them could run code)"
        ) from None
    except Exception as error:  # any other failure to read the user's file
        raise CheckpointError(
            f"trainer.init_weights={path}: not a torch.save file ({error.__class__.__name__})"
        ) from None
    if isinstance(state, dict) and state.get("format") == checkpoint.FORMAT:
        checkpoint.check_intact(state, f"trainer.init_weights={path}")
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]  # a whole training checkpoint: ours, or another project's
    if not isinstance(state, dict) or not all(
        isinstance(name, str) and isinstance(tensor, torch.Tensor) for name, tensor in state.items()
    ):
        raise CheckpointError(
            f"trainer.init_weights={path}: not a state_dict (a dict of tensors by name)"
        )
    for prefix in WRAPPER_PREFIXES:
        if state and all(name.startswith(prefix) for name in state):
            state = {name.removeprefix(prefix): tensor for name, tensor in state.items()}
    return state
