"""Evaluate a checkpoint: `python -m repro.evaluate ckpt=PATH [split=test] [device=auto]`.

The model and data are rebuilt from the config stored in the checkpoint; `data.root=...`
may point at the data's new place on this machine, and `tta=none|flip` overrides the
run's `trainer.tta`. Prints loss and accuracy; with `out=FILE`, also writes them as JSON.
"""

from __future__ import annotations

if __name__ == "__main__":  # before torch is imported, so the re-exec costs next to nothing
    from repro.launch import pin_hash_seed

    pin_hash_seed("repro.evaluate")

import logging
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from repro import build, config
from repro.data.cache import decode
from repro.data.loader import Batches, LoaderContext, eval_loader
from repro.data.sources import ImageFiles
from repro.engine.checkpoint import load
from repro.engine.evaluation import evaluate
from repro.errors import ConfigError, UserError, exit_with
from repro.files import write_json_atomic
from repro.runtime.devices import select_device, use_pinned_memory
from repro.runtime.memory_format import MemoryFormat
from repro.runtime.precision import Precision

SPLITS = ("train", "val", "test")
ARGUMENTS = {"ckpt", "split", "device", "out", "data.root", "batch_size", "tta"}


def evaluate_checkpoint(
    ckpt: Path,
    split: str = "test",
    device_name: str = "auto",
    data_root: str | None = None,
    batch_size: int | None = None,
    tta: str | None = None,
) -> dict[str, Any]:
    """Loss and accuracy of the checkpoint's model on one split of its dataset, with the
    run's test-time augmentation unless `tta` names one."""
    if split not in SPLITS:
        raise ConfigError("split", split, f"choose one of {', '.join(SPLITS)}")
    allowed = config.CHOICES["trainer.tta"]
    if tta is not None and tta not in allowed:
        raise ConfigError("tta", tta, f"choose one of {', '.join(allowed)}")
    state = load(ckpt)
    cfg = OmegaConf.create(state["config"])
    tta = tta or cfg.trainer.get("tta", "none")
    if data_root is not None:
        cfg.data.root = data_root
    root_seed = state["root_seed"]
    device = select_device(device_name)
    try:
        precision = Precision(cfg.amp.mode, device)
    except ConfigError:  # trained with fp16 on a GPU, evaluated on a CPU: full precision
        precision = Precision("off", device)
    memory_format = MemoryFormat(cfg.memory_format.name)

    cached = cfg.data.get("cache", "none") == "memory"
    cfg.data.cache = "none"  # decode only the split evaluated
    source = getattr(build.splits(cfg, root_seed), split)
    if cached and isinstance(source, ImageFiles):
        source = decode(source, cfg.data, split)
    _, eval_transform = build.pipelines(cfg, resized=cached)
    pin_memory = use_pinned_memory(cfg.dataloader.pin_memory, device)
    context = LoaderContext(root_seed, device=device, pin_memory=pin_memory)
    loader = eval_loader(
        source, eval_transform, batch_size or cfg.trainer.eval_batch_size, cfg.dataloader, context
    )
    model = build.model(cfg, root_seed)
    model.load_state_dict(state["model"])
    model = memory_format.model(model.to(device))
    to_device = build.device_batches(cfg, device)
    with Batches(loader) as batches:
        one_pass = batches.take(len(loader))
        prepare, autocast = memory_format.batch, precision.autocast
        result = evaluate(model, one_pass, to_device, prepare, autocast, tta=tta)
    return {
        "split": split,
        "images": len(source),
        "tta": tta,
        **result,
        "step": state["position"]["step"],
    }


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        args = OmegaConf.from_dotlist(argv)
        flat = {key for key in argv if "=" in key}
        unknown = sorted({a.split("=", 1)[0] for a in flat} - ARGUMENTS)
        if unknown or "=" not in " ".join(argv):
            given = unknown[0] if unknown else "(none)"
            raise ConfigError("argument", given, f"use {', '.join(sorted(ARGUMENTS))} as key=value")
        if "ckpt" not in args:
            raise ConfigError(
                "ckpt", None, "the path of a checkpoint, e.g. ckpt=outputs/.../last.pt"
            )
        result = evaluate_checkpoint(
            Path(str(args.ckpt)),
            str(args.get("split", "test")),
            str(args.get("device", "auto")),
            OmegaConf.select(args, "data.root"),
            args.get("batch_size"),
            args.get("tta"),
        )
    except UserError as error:
        exit_with(error)
    flips = ", flip test-time augmentation" if result["tta"] == "flip" else ""
    print(
        f"{result['split']}: loss {result['loss']:.4f}  acc {result['acc']:.4f}  "
        f"({result['images']} images, checkpoint step {result['step']}{flips})"
    )
    if "out" in args:
        write_json_atomic(Path(str(args.out)), result)


if __name__ == "__main__":
    main(sys.argv[1:])
