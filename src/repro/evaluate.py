"""Evaluate a checkpoint: `python -m repro.evaluate ckpt=RUN_DIR_OR_FILE [split=test]
[device=auto]` (a run folder means its checkpoints/best.pt, or last.pt without one).

The model and data are rebuilt from the config stored in the checkpoint; `data.root=...`
may point at the data's new place on this machine, `tta=none|flip|flip_translate` overrides
the run's `trainer.tta`, and `per_class=true` adds each class's accuracy and the confusion
matrix. Nothing reaches the network (the dataset is downloaded only with `download=true`).
Prints loss, accuracy and the results of the run's `metrics` (top-5 accuracy, F1 ...); with
`out=FILE`, also writes them as JSON (an existing file is refused before any work unless
`overwrite=true`). A stored config naming a target this checkout does not trust is refused
unless `trust=true` (see repro.core.runs.trust).
"""

from __future__ import annotations

if __name__ == "__main__":  # before torch is imported, so the re-exec costs next to nothing
    from repro.core.runtime.launch import start

    start("repro.evaluate")

import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from repro.core import build, tasks
from repro.core.data.cache import decode
from repro.core.data.loader import Batches
from repro.core.data.sources import in_memory
from repro.core.engine.evaluation import evaluate
from repro.core.errors import ConfigError, UserError, exit_with, warnings_to_stderr
from repro.core.files import json_text
from repro.core.guards.network import offline
from repro.core.restore import arguments, classes_of, output_file, restore, write_result
from repro.core.runs import resume
from repro.core.text import for_terminal
from repro.core.watch.scores import build_scores

SPLITS = ("train", "val", "test")
# and restore.SHARED
ARGUMENTS = {"split", "device", "data.root", "batch_size", "tta", "per_class", "download"}


def evaluate_checkpoint(
    ckpt: Path,
    split: str = "test",
    device_name: str = "auto",
    data_root: str | None = None,
    batch_size: int | None = None,
    tta: str | None = None,
    per_class: bool = False,
    trust: bool = False,
    download: bool = False,
) -> dict[str, Any]:
    """Loss, accuracy and the run's metrics of the checkpoint's model on one split of its
    dataset, with the run's test-time augmentation unless `tta` names one; with `per_class`,
    each class's accuracy and the confusion matrix (rows: true class, columns: predicted).
    `download`: fetch the dataset if it is missing (the stored config's `data.download` is
    never followed)."""
    if not isinstance(per_class, bool):
        raise ConfigError("per_class", per_class, "true or false")
    if split not in SPLITS:
        raise ConfigError("split", split, f"choose one of {', '.join(SPLITS)}")
    run = restore(ckpt, device_name, data_root, tta, trust)
    cfg = run.cfg
    cfg.data.download = download is True
    cached = cfg.data.get("cache", "none") == "memory"
    cfg.data.cache = "none"  # decode only the split evaluated
    data = build.splits(cfg, run.state["root_seed"])
    resume.check_same_classes(run.state, data.classes, cfg.data.root, "its outputs mean others")
    source = getattr(data, split)
    if len(source) == 0:  # data.val_size=0: every image trained
        raise ConfigError("split", split, "a split with images (this run has no validation split)")
    if cached and in_memory(source) is None:
        source = decode(source, cfg.data, split, cfg.logger.get("progress", "auto"))
    _, eval_transform = build.pipelines(cfg, cached, data.any_size, run.normalisation)
    loader = run.loader(source, eval_transform, batch_size)
    prepare, autocast = run.memory_format.batch, run.precision.autocast
    single_label = tasks.of(run.objective).single_label
    classes = classes_of(run.state, cfg) if per_class and single_label else None
    scores = build_scores(cfg.get("metrics"), classes_of(run.state, cfg))
    names = run.state.get("classes") or list(data.classes)
    with Batches(loader) as batches:
        one_pass = batches.take(len(loader))
        options = {"tta": run.tta, "classes": classes, "objective": run.objective}
        options |= {"scores": scores, "label_names": names}
        result = evaluate(run.model, one_pass, run.to_device, prepare, autocast, **options)
    if per_class and not single_label:  # each label's average precision and F1
        result["per_label"] = [
            {"label": name, "ap": result[f"ap_{key}"], "f1": result[f"f1_{key}"]}
            for name, key in zip(names, tasks.column_names(names), strict=True)
        ]
    elif per_class:
        names = run.state.get("classes") or [str(i) for i in range(len(result["confusion"]))]
        result["per_class"] = [
            {"class": name, "images": sum(row), "acc": row[index] / sum(row) if sum(row) else None}
            for index, (name, row) in enumerate(zip(names, result["confusion"], strict=True))
        ]
    return {
        "split": split,
        "images": len(source),
        "tta": run.tta,
        **({"metrics": scores.names} if scores else {}),  # the keys of the metrics' results
        **result,
        "step": run.state["position"]["step"],
    }


def main(argv: list[str]) -> None:
    warnings_to_stderr()
    try:
        args = arguments(argv, ARGUMENTS)
        overwrite = args.get("overwrite", False)
        out = output_file(str(args.out), overwrite) if "out" in args else None
        download = args.get("download", False)
        with offline(f"the config comes from ckpt={args.ckpt}", download):
            result = evaluate_checkpoint(
                Path(str(args.ckpt)),
                str(args.get("split", "test")),
                str(args.get("device", "auto")),
                OmegaConf.select(args, "data.root"),
                args.get("batch_size"),
                args.get("tta"),
                args.get("per_class", False),
                args.get("trust", False),
                download,
            )
    except UserError as error:
        exit_with(error)
    views = f", {result['tta']} test-time augmentation" if result["tta"] != "none" else ""
    mean_ap = f"  map {result['map']:.4f}" if "map" in result else ""  # multi-label
    print(
        f"{result['split']}: loss {result['loss']:.4f}  acc {result['acc']:.4f}{mean_ap}  "
        f"({result['images']} images, checkpoint step {result['step']}{views})"
    )
    # Class and metric names come from the checkpoint: no escape sequence reaches the terminal.
    for row in result.get("per_class", []):
        shown = "-" if row["acc"] is None else f"{row['acc']:.4f}"
        print(f"  {for_terminal(row['class'])}: acc {shown} ({row['images']} images)")
    for row in result.get("per_label", []):
        print(f"  {for_terminal(row['label'])}: ap {row['ap']:.4f} f1 {row['f1']:.4f}")
    for name in result.get("metrics", []):  # a number, or a matrix row by row
        value, label = result[name], for_terminal(name)
        rows = [" ".join(map(str, row)) for row in value] if isinstance(value, list) else []
        print(f"  {label}: {value:.4f}" if not rows else "\n    ".join([f"  {label}:", *rows]))
    if out is not None:
        write_result(out, json_text(result))


if __name__ == "__main__":
    main(sys.argv[1:])
