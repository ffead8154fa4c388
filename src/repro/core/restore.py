"""A trained model back from its checkpoint, on this machine, ready to evaluate or predict."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import DataLoader

from repro.core import build, config
from repro.core.data.datasets import Source
from repro.core.data.loader import LoaderContext, eval_loader
from repro.core.data.transforms import Compose
from repro.core.errors import CheckpointError, ConfigError, StorageError, exit_with
from repro.core.files import write_text_atomic, writing
from repro.core.guards import received
from repro.core.runs import resume
from repro.core.runs.checkpoint import BEST_FILE, load
from repro.core.runs.trust import as_data
from repro.core.runtime.devices import select_device, use_pinned_memory
from repro.core.runtime.memory_format import MemoryFormat
from repro.core.runtime.precision import Precision
from repro.core.tasks.objectives import Objective


@dataclass
class Restored:
    """The run's config and checkpoint, and its model in eval mode on `device`, in the run's
    memory format, with the precision and test-time augmentation to run it with."""

    cfg: DictConfig
    state: dict[str, Any]
    model: nn.Module
    device: torch.device
    precision: Precision
    memory_format: MemoryFormat
    to_device: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    tta: str
    objective: Objective
    normalisation: dict[str, Any]  # as the run recorded it (build.normalisation)
    checkpoint: Path  # the file read: `ckpt`, or the one `checkpoint_file` chose in a run folder

    def loader(self, source: Source, transform: Compose, batch_size: int | None) -> DataLoader:
        """Batches of `source` in its order (one pass: `Batches(loader).take(len(loader))`)."""
        cfg = self.cfg
        pin_memory = use_pinned_memory(cfg.dataloader.pin_memory, self.device)
        context = LoaderContext(self.state["root_seed"], device=self.device, pin_memory=pin_memory)
        size = batch_size or cfg.trainer.eval_batch_size
        return eval_loader(source, transform, size, cfg.dataloader, context)


TESTED = ("best", "last", "ema")  # what summary.json's `test_weights` may say


def checkpoint_file(ckpt: Path) -> tuple[Path, str]:
    """The file to read and which weights in it (`model`, or `ema`: the weight average it
    keeps). `ckpt` itself, or for a run folder (or its checkpoints/) the weights its test after
    training used, as its summary.json says (`test_weights`): best.pt, last.pt, or the average
    in last.pt. A folder whose summary does not say (a run killed, or still going) gives its
    best.pt, else last.pt."""
    if not ckpt.is_dir():
        return ckpt, "model"
    run_dir = ckpt.parent if ckpt.name == "checkpoints" else ckpt
    tested = _recorded_test_weights(run_dir / "summary.json")
    names = {"best": (BEST_FILE, "last.pt"), "last": ("last.pt",), "ema": ("last.pt",)}
    for name in names.get(tested, (BEST_FILE, "last.pt")):
        found = run_dir / "checkpoints" / name
        if found.exists() or found.is_symlink():  # whatever it is, the boundary says if it reads
            return found, "ema" if tested == "ema" else "model"
    raise CheckpointError(f"{ckpt}: a folder with no checkpoints/{BEST_FILE} or last.pt in it")


def _recorded_test_weights(summary: Path) -> str | None:
    """`test_weights` of a run's summary.json (a file from whoever made the folder: a value
    outside TESTED, or a file that does not parse, says nothing)."""
    try:
        recorded = received.load_json(summary, root=summary.parent).get("test_weights")
    except (received.ReceivedFileError, AttributeError):
        return None
    return recorded if recorded in TESTED else None


def restore(
    ckpt: Path,
    device_name: str = "auto",
    data_root: str | None = None,
    tta: str | None = None,
    trust: bool = False,
) -> Restored:
    """The checkpoint's model rebuilt from its stored config and seed; `ckpt` is a checkpoint
    file or a run folder (`checkpoint_file`), so that every checkpoint command takes both alike.
    `data_root` re-points the data; `tta` overrides the run's `trainer.tta`. The stored config
    must name only targets this checkout trusts, unless `trust` (see repro.core.runs.trust)."""
    allowed = config.CHOICES["trainer.tta"]
    if tta is not None and tta not in allowed:
        raise ConfigError("tta", tta, f"choose one of {', '.join(allowed)}")
    named = ckpt  # the folder (or file) the command named: what it reads must lie inside
    ckpt, weights = checkpoint_file(ckpt)
    state = load(ckpt, root=named if named.is_dir() else None)
    stored = state.get("config")
    stored = as_data(resume.upgrade(stored) if isinstance(stored, dict) else stored, ckpt, trust)
    cfg = OmegaConf.create(without_pretrained_weights(stored))
    resume.fill_declared(cfg)  # a checkpoint written before some keys existed
    if data_root is not None:
        cfg.data.root = data_root
    device = select_device(device_name)
    try:
        precision = Precision(cfg.amp.mode, device)
    except ConfigError:  # trained with fp16 on a GPU, run on a CPU: full precision
        precision = Precision("off", device)
    memory_format = MemoryFormat(cfg.memory_format.name)
    model = build.model(cfg, state["root_seed"], num_classes=classes_of(state, cfg))
    try:
        model.load_state_dict(_weights(state, weights, ckpt))
    except RuntimeError as error:  # torch's words run over many lines: the first says it
        said = str(error).strip().splitlines()[-1].strip()
        raise CheckpointError(
            f"{ckpt}: its weights do not fit the model its config builds ({said})"
        ) from None
    model = memory_format.model(model.to(device)).eval()
    # Older checkpoints record none: their data.* was all there was.
    norm = state.get("normalisation") or build.normalisation(cfg)
    to_device = build.device_batches(cfg, device, norm)
    tta = tta or cfg.trainer.tta
    objective = build.objective(cfg)
    return Restored(
        cfg, state, model, device, precision, memory_format, to_device, tta, objective, norm, ckpt
    )


def _weights(state: dict[str, Any], which: str, ckpt: Path) -> dict[str, Any]:
    """The model's weights, or the weight average's that a run tested (`ema`)."""
    if which == "model":
        return state["model"]
    average = (state.get("components") or {}).get("ema", state.get("ema"))  # older: top-level
    if not isinstance(average, dict):
        raise CheckpointError(f"{ckpt}: its run tested a weight average the file does not hold")
    return average


def without_pretrained_weights(config: Any) -> Any:
    """`config` with every model part built without pretrained weights, at any depth (a
    backbone inside a model too): the checkpoint holds the weights, and fetching them would
    reach the network or files the config names."""
    if isinstance(config, list):
        return [without_pretrained_weights(item) for item in config]
    if not isinstance(config, dict):
        return config
    off = {"pretrained": False, "weights": None, "weights_backbone": None}
    builds = "_target_" in config
    return {
        key: off[key] if builds and key in off else without_pretrained_weights(value)
        for key, value in config.items()
    }


def classes_of(state: dict[str, Any], cfg: DictConfig) -> int:
    """How many classes the checkpoint's model tells apart: its data's, as recorded."""
    recorded = state.get("classes")
    return len(recorded) if recorded else int(cfg.data.num_classes)


# What every checkpoint command (evaluate, predict, export) takes: `arguments` requires `ckpt`,
# `output_file` checks `out` and `overwrite`, `restore` takes `trust`.
SHARED = {"ckpt", "out", "overwrite", "trust"}


def arguments(argv: list[str], own: set[str]) -> DictConfig:
    """The `key=value` arguments of a checkpoint command: the `SHARED` ones and its `own`;
    `ckpt` is required, and an unknown key is refused naming the ones allowed."""
    args = OmegaConf.from_dotlist(argv)
    given = {item.split("=", 1)[0] for item in argv if "=" in item}
    unknown = sorted(given - SHARED - own)
    if unknown or not given:
        named = unknown[0] if unknown else "(none)"
        raise ConfigError("argument", named, f"use {', '.join(sorted(SHARED | own))} as key=value")
    if "ckpt" not in args:
        allowed = "a checkpoint or a run folder, e.g. ckpt=outputs/runs/<run> or .../last.pt"
        raise ConfigError("ckpt", None, allowed)
    return args


def output_file(name: str, overwrite: object = False) -> Path:
    """Where a checkpoint command writes its result, checked before any work: an existing file
    is never replaced unless `overwrite` is true, and a missing folder must be one that can be
    made (`write_result` makes it). Nothing is created here: a command that fails later
    leaves no trace."""
    out = Path(os.path.normpath(name))  # `missing/../q.csv` would make `missing`
    if not isinstance(overwrite, bool):
        raise ConfigError("overwrite", overwrite, "true or false")
    if out.is_dir():
        raise ConfigError("out", name, "a file name; this is a folder")
    if out.exists() and not overwrite:
        raise ConfigError("out", name, "a file that does not exist yet, or add overwrite=true")
    # The nearest entry that exists, a dangling link included, must be a folder we can write in.
    existing = next(folder for folder in out.absolute().parents if os.path.lexists(folder))
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        allowed = f"a file in a folder that can be made ({existing} is not a writable folder)"
        raise ConfigError("out", name, allowed)
    return out


def write_result(out: Path, text: str) -> None:
    """Write a command's result to `out` (checked by `output_file`), making its folder; what
    still fails (a full disk) is one line, not a traceback."""
    try:
        with writing(out):
            out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, text)
    except StorageError as error:
        exit_with(error)
