"""Predict the classes of image files with a trained checkpoint:

    python -m repro.predict ckpt=RUN_DIR_OR_FILE images=FOLDER_OR_FILE [out=predictions.csv]
        [top_k=1] [device=auto] [batch_size=N] [tta=none|flip|flip_translate]
        [overwrite=false] [trust=false]

A run folder as `ckpt` means its checkpoints/best.pt, or last.pt without one. Each image goes
through the run's evaluation transform (resized to the run's size if it comes in another) and
the model, as `repro.evaluate` runs it. `out` gets one CSV row per image, in sorted path
order: its path, then the `top_k` classes and their probabilities. An existing `out` is
refused before any work unless `overwrite=true`. A stored config naming a target this
checkout does not trust is refused unless `trust=true` (see repro.core.runs.trust).
"""

from __future__ import annotations

if __name__ == "__main__":  # before torch is imported, so the re-exec costs next to nothing
    from repro.core.runtime.launch import start

    start("repro.predict")

import csv
import io
import sys
from pathlib import Path
from typing import Any

import torch

from repro.core import build, tasks
from repro.core.data.loader import Batches
from repro.core.data.sources import IMAGE_SUFFIXES, ImageFiles
from repro.core.engine.evaluation import predict
from repro.core.errors import ConfigError, DataError, UserError, exit_with, warnings_to_stderr
from repro.core.guards.network import offline
from repro.core.restore import arguments, output_file, restore, write_result
from repro.core.text import for_csv

ARGUMENTS = {"images", "top_k", "device", "batch_size", "tta"}  # and restore.SHARED


def image_files(images: Path) -> list[Path]:
    """`images` itself, or every image file under it, in sorted order."""
    if images.is_file():
        return [images]
    if not images.is_dir():
        raise DataError(f"images={images}: no such file or folder")
    found = sorted(p for p in images.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if not found:
        suffixes = ", ".join(sorted(IMAGE_SUFFIXES))
        raise DataError(f"images={images}: no image files ({suffixes}) under it")
    return found


def predict_files(
    ckpt: Path,
    images: Path,
    top_k: int = 1,
    device_name: str = "auto",
    batch_size: int | None = None,
    tta: str | None = None,
    trust: bool = False,
) -> list[dict[str, Any]]:
    """One row per image file: its path, and its `top_k` classes with their probabilities (a
    multi-label run's: the labels predicted, and each label's probability)."""
    run = restore(ckpt, device_name, tta=tta, trust=trust)
    classes = run.state.get("classes") or [str(i) for i in range(run.cfg.data.num_classes)]
    task = tasks.of_config(run.cfg.objective)  # a config trust has passed (restore)
    if not isinstance(top_k, int) or not 1 <= top_k <= len(classes):
        raise ConfigError("top_k", top_k, f"an integer from 1 to the {len(classes)} classes")
    paths = image_files(images)
    # Files come in any size: resized as the run's evaluation resizes, or to its image size.
    run.cfg.data.resize = run.cfg.data.resize or run.cfg.data.image_size
    _, eval_transform = build.pipelines(run.cfg, norm=run.normalisation)
    loader = run.loader(ImageFiles(paths, [0] * len(paths)), eval_transform, batch_size)
    probabilities = []
    with torch.no_grad(), Batches(loader) as batches:
        for images_batch, labels in batches.take(len(loader)):
            batch, _ = run.to_device(images_batch, labels)
            with run.precision.autocast():
                logits = predict(run.model, run.memory_format.batch(batch), run.tta)
            probabilities.append(task.probabilities(logits))
    every = torch.cat(probabilities).cpu()  # one copy to the host
    if not task.single_label:
        return [_labels_row(path, row, classes) for path, row in zip(paths, every, strict=True)]
    best = every.topk(top_k, dim=1)
    rows = []
    for path, values, indices in zip(paths, best.values, best.indices, strict=True):
        row: dict[str, Any] = {"path": str(path)}
        for rank, (value, index) in enumerate(zip(values, indices, strict=True), start=1):
            suffix = "" if rank == 1 else f"_{rank}"
            row[f"class{suffix}"] = classes[int(index)]
            row[f"probability{suffix}"] = round(float(value), 6)
        rows.append(row)
    return rows


def _labels_row(path: Path, probabilities: torch.Tensor, labels: list[str]) -> dict[str, Any]:
    """A multi-label prediction: the labels above probability 0.5 (`;` between them), then
    each label's probability under its name."""
    said = [label for label, value in zip(labels, probabilities, strict=True) if value > 0.5]
    row: dict[str, Any] = {"path": str(path), "labels": ";".join(said)}
    named = zip(tasks.column_names(labels), probabilities.tolist(), strict=True)
    return row | {f"p_{name}": round(value, 6) for name, value in named}


def main(argv: list[str]) -> None:
    warnings_to_stderr()
    try:
        args = arguments(argv, ARGUMENTS)
        if "images" not in args:
            raise ConfigError("images", None, "a folder of image files (or one file)")
        out = output_file(str(args.get("out", "predictions.csv")), args.get("overwrite", False))
        with offline(f"the config comes from ckpt={args.ckpt}"):
            rows = predict_files(
                Path(str(args.ckpt)),
                Path(str(args.images)),
                args.get("top_k", 1),
                str(args.get("device", "auto")),
                args.get("batch_size"),
                args.get("tta"),
                args.get("trust", False),
            )
    except UserError as error:
        exit_with(error)
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, list(rows[0]))
    writer.writeheader()
    # Class names come from the checkpoint, paths from a folder: none may run in a spreadsheet.
    writer.writerows({key: for_csv(value) for key, value in row.items()} for row in rows)
    write_result(out, text.getvalue())
    print(f"{len(rows)} images: predictions in {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
