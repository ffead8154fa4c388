"""One writer per export format: each writes the file, reads it back with its own runtime and
says how far the reloaded model is from PyTorch's (the parity check).

ONNX and TorchScript hold `Normalised(model)`: float32 NCHW images in [0, 1] in, logits out,
any batch size. safetensors holds the model's own state dict (the normalisation is the
consumer's, written in the sidecar JSON); its check is that every tensor reads back equal.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from repro.core.errors import ConfigError, UserError

FORMATS = ("onnx", "torchscript", "safetensors")
OPSET = 18  # onnxruntime has run it since 1.14 (2023); newer opsets shut out older runtimes
BATCH_SIZES = (1, 17)  # besides the whole batch: the batch axis really is dynamic
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class ExportError(UserError):
    """A model that cannot be exported in a format, or whose export disagrees with PyTorch."""


class Normalised(nn.Module):
    """The model behind its input normalisation: images in [0, 1] in, logits out."""

    def __init__(self, model: nn.Module, mean: list[float], std: list[float]) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model((images - self.mean) / self.std)


def write(fmt: str, wrapped: Normalised, images: Any, tmp: Path, target: str) -> Callable | None:
    """Write `wrapped` (safetensors: its model's weights) to `tmp` in `fmt`; the model read
    back, as a function of a float32 batch (None for safetensors, checked here). `target`:
    what built the model (`model._target_`), named if it cannot be exported."""
    try:
        return WRITERS[fmt](wrapped, images, tmp)
    except ImportError as error:
        allowed = f"needs the export extra ({error.name} is missing): `uv sync --extra export`"
        raise ConfigError("format", fmt, allowed) from None
    except ExportError:
        raise
    except Exception as error:  # an exporter fails in many ways; the innermost names the cause
        while error.__cause__ is not None:
            error = error.__cause__
        cause = _ANSI.sub("", str(error)).strip().splitlines()
        reason = f"{type(error).__name__}: {cause[0][:200] if cause else ''}"
        raise ExportError(
            f"model._target_={target!r} cannot be exported as {fmt} ({reason})"
        ) from None


def _onnx(wrapped: Normalised, images: torch.Tensor, tmp: Path) -> Callable:
    import onnxruntime
    import onnxscript  # noqa: F401  (the exporter's; a missing one is named here, not deep inside)

    batch = torch.export.Dim("batch")
    torch.onnx.export(
        wrapped,
        (images[:2],),
        str(tmp),
        dynamo=True,
        opset_version=OPSET,
        verbose=False,
        input_names=["images"],
        output_names=["logits"],
        dynamic_shapes=({0: batch},),
        external_data=False,  # one self-contained file (models under 2 GB)
    )
    session = onnxruntime.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    return lambda batch: torch.from_numpy(session.run(["logits"], {"images": batch.numpy()})[0])


def _torchscript(wrapped: Normalised, images: torch.Tensor, tmp: Path) -> Callable:
    with warnings.catch_warnings():  # torch marks TorchScript deprecated; the file is still wanted
        warnings.simplefilter("ignore", FutureWarning)
        traced = torch.jit.trace(wrapped, images[:2], check_trace=False)  # checked below
        torch.jit.save(traced, str(tmp))
        return torch.jit.load(str(tmp), map_location="cpu")


def _safetensors(wrapped: Normalised, images: torch.Tensor, tmp: Path) -> None:
    from safetensors.torch import load_file, save_file

    # Copies: safetensors refuses tensors that share memory or are not contiguous.
    state = {
        name: tensor.clone().contiguous() for name, tensor in wrapped.model.state_dict().items()
    }
    save_file(state, str(tmp), metadata={"format": "pt"})
    loaded = load_file(str(tmp))
    same = loaded.keys() == state.keys() and all(
        torch.equal(loaded[k], v) for k, v in state.items()
    )
    if not same:
        raise ExportError(f"{tmp}: the weights read back differ from those written")
    return None


WRITERS: dict[str, Any] = {"onnx": _onnx, "torchscript": _torchscript, "safetensors": _safetensors}


def parity(run_exported: Callable, images: torch.Tensor, expected: torch.Tensor) -> dict[str, Any]:
    """The exported model's logits on `images` (float32 in [0, 1]) at batch sizes 1, 17 and
    all of them, against PyTorch's `expected`: the largest difference, and the largest logit."""
    sizes = [size for size in BATCH_SIZES if size < len(images)] + [len(images)]
    largest = 0.0
    for size in sizes:
        got = run_exported(images[:size].contiguous())
        if got.shape != expected[:size].shape:
            shapes = f"{tuple(got.shape)}, not {tuple(expected[:size].shape)}"
            raise ExportError(f"the exported model gave logits of shape {shapes} at batch {size}")
        largest = max(largest, float((got - expected[:size]).abs().max()))
    return {
        "images": len(images),
        "batch_sizes": sizes,
        "max_abs_diff": largest,
        "max_abs_logit": float(expected.abs().max()),
    }
