"""Export a checkpoint's model:

    python -m repro.export ckpt=RUN_DIR_OR_FILE format=onnx|torchscript|safetensors
        [weights=model|ema] [out=PATH] [images=FOLDER] [data.root=PATH] [tolerance=1e-4]
        [overwrite=false] [trust=false]

A run folder as `ckpt` means its checkpoints/best.pt, or last.pt without one. ONNX and
TorchScript files take float32 NCHW images in [0, 1] of the run's size, any batch size, with
the run's normalisation folded in; `out` (default model.onnx, model.torchscript.pt or
model.safetensors) gets a sidecar `<out>.json` saying all a consumer needs. Before the file
takes its name, the model read back by its own runtime (onnxruntime on the CPU for ONNX) must
give PyTorch's logits on 64 real images (the run's validation split, or `images`) at batch
sizes 1, 17 and 64, to within `tolerance` x max(1, the largest logit); if not, nothing is left.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from repro.core import build
from repro.core.data.sources import ImageFiles
from repro.core.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    UserError,
    exit_with,
    warnings_to_stderr,
)
from repro.core.files import atomic_path, write_json_atomic, writing
from repro.core.guards.network import offline
from repro.core.restore import Restored, arguments, classes_of, output_file, restore
from repro.core.runs.integrity import KEY as DIGEST
from repro.export.formats import FORMATS, OPSET, ExportError, Normalised, parity, write
from repro.predict import image_files

ARGUMENTS = {"format", "weights", "images", "data.root", "tolerance"}  # and restore.SHARED
SUFFIXES = {"onnx": ".onnx", "torchscript": ".torchscript.pt", "safetensors": ".safetensors"}
PARITY_IMAGES = 64
RULE = "max_abs_diff <= tolerance * max(1, max_abs_logit)"


def check_choices(fmt: str, weights: str, tolerance: object) -> None:
    """The export's own arguments, checked before anything is loaded."""
    if fmt not in FORMATS:
        raise ConfigError("format", fmt, " or ".join(FORMATS))
    if weights not in ("model", "ema"):
        raise ConfigError("weights", weights, "model (the trained weights) or ema (their average)")
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or tolerance < 0:
        allowed = "a number >= 0 (a share of the largest logit, or of 1 if that is smaller)"
        raise ConfigError("tolerance", tolerance, allowed)


def load_weights(run: Restored, weights: str, ckpt: Path) -> None:
    """Load the weights `weights` names into the restored model: the trained ones (as restored)
    or the average that `+components=ema` kept beside them."""
    if weights == "ema":
        average = (run.state.get("components") or {}).get("ema", run.state.get("ema"))
        if average is None:
            raise CheckpointError(
                f"{ckpt}: holds no weight average for weights=ema (the run had no "
                "+components=ema); use weights=model"
            )
        run.model.load_state_dict(average)


def normalisation(run: Restored) -> dict[str, Any]:
    """The input normalisation: a pretrained model's, recorded in the checkpoint, else the
    config's `data.mean`, `data.std` and `data.image_size`."""
    data = run.cfg.data
    recorded = run.state.get("normalisation")
    found = dict(recorded) if recorded else {"mean": list(data.mean), "std": list(data.std)}
    found.setdefault("image_size", int(data.image_size))
    found.setdefault("interpolation", "bilinear")  # data.transforms.ResizeShorter's
    return {**found, "resize": data.get("resize"), "from": "checkpoint" if recorded else "config"}


def real_images(run: Restored, folder: str | None) -> tuple[torch.Tensor, str]:
    """64 uint8 images through the run's evaluation transform: the first of its validation
    split, or of the image files under `folder` (fewer are repeated); and where they came from."""
    cfg = run.cfg
    cfg.data.cache = "none"  # decode only the images used
    if folder is not None:
        paths = image_files(Path(folder))[:PARITY_IMAGES]
        cfg.data.resize = cfg.data.resize or cfg.data.image_size  # files come in any size
        source, where = ImageFiles(paths, [0] * len(paths)), f"{folder} ({len(paths)} files)"
        _, transform = build.pipelines(cfg)
    else:
        try:
            data = build.splits(cfg, run.state["root_seed"])
        except DataError as error:
            hint = "the parity check needs real images: give images=FOLDER or data.root=PATH"
            raise DataError(f"{error} ({hint})") from None
        source, where = data.val, "the run's validation split"
        _, transform = build.pipelines(cfg, any_size=data.any_size)
    count = min(PARITY_IMAGES, len(source))
    pixels = torch.stack([transform(source[index][0], None) for index in range(count)])
    if count < PARITY_IMAGES:  # repeated, so that every batch size is checked all the same
        pixels = pixels.repeat(-(-PARITY_IMAGES // count), 1, 1, 1)[:PARITY_IMAGES]
        where += f", repeated to {PARITY_IMAGES}"
    return pixels, where


@contextmanager
def folder_of(out: Path) -> Iterator[None]:
    """`out`'s folder, made for the block; if the block fails, the folders made go again."""
    made = [folder for folder in out.absolute().parents if not folder.exists()]  # deepest first
    with writing(out):
        out.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        for folder in made:
            folder.rmdir()
        raise


@torch.no_grad()
def export_checkpoint(
    ckpt: Path,
    fmt: str,
    out: Path,
    weights: str = "model",
    images: str | None = None,
    data_root: str | None = None,
    tolerance: float = 1e-4,
    trust: bool = False,
) -> dict[str, Any]:
    """Write the checkpoint's model to `out` in `fmt` and its sidecar JSON; returns the JSON."""
    check_choices(fmt, weights, tolerance)
    run = restore(ckpt, "cpu", data_root, trust=trust)
    ckpt = run.checkpoint  # a run folder's best.pt (or last.pt)
    load_weights(run, weights, ckpt)
    model = run.model.to(memory_format=torch.contiguous_format).float().eval()
    norm = normalisation(run)
    wrapped = Normalised(model, norm["mean"], norm["std"]).eval()
    pixels, where = real_images(run, images) if fmt != "safetensors" else (None, None)
    sidecar = out.with_name(f"{out.name}.json")
    floats = pixels.float() / 255 if pixels is not None else None
    with folder_of(out), atomic_path(out) as tmp:  # `out` takes its name only once checked
        run_exported = write(fmt, wrapped, floats, tmp, str(run.cfg.model.get("_target_")))
        checked = {"check": "every tensor read back equal"}
        if run_exported is not None:  # PyTorch's logits as repro.evaluate normalises, float32
            expected = model(run.to_device(pixels, torch.zeros(len(pixels)))[0])
            checked = {**parity(run_exported, floats, expected), "images_from": where}
            allowed = tolerance * max(1.0, checked["max_abs_logit"])
            checked |= {"tolerance": tolerance, "rule": RULE, "allowed": allowed}
            if not checked["max_abs_diff"] <= allowed:
                raise ExportError(
                    f"the {fmt} export disagrees with PyTorch: its logits differ by up to "
                    f"{checked['max_abs_diff']:.3g} on {len(pixels)} images, more than "
                    f"tolerance={tolerance} allows ({allowed:.3g}); nothing written"
                )
        record = sidecar_record(run, fmt, out, ckpt, weights, norm, checked)
        write_json_atomic(sidecar, record)
    return record


def sidecar_record(
    run: Restored, fmt: str, out: Path, ckpt: Path, weights: str, norm: dict, checked: dict
) -> dict[str, Any]:
    """What a consumer of the exported file needs, and where it came from."""
    folded = fmt != "safetensors"
    size = norm["image_size"]
    return {
        "format": fmt,
        "file": out.name,
        **({"opset": OPSET} if fmt == "onnx" else {}),
        "input": {
            "name": "images",
            "layout": "NCHW",
            "dtype": "float32",
            "channels": "RGB",
            "range": [0, 1] if folded else "(x - mean) / std, x in [0, 1]",
            "shape": ["batch", len(norm["mean"]), size, size],
        },
        "output": {"name": "logits", "shape": ["batch", classes_of(run.state, run.cfg)]},
        "normalisation": {**norm, "folded_in": folded},
        "classes": run.state.get("classes"),
        "model": OmegaConf.to_container(run.cfg.model),
        "weights": weights,
        "source": {
            "checkpoint": str(ckpt),
            "content_sha256": run.state.get(DIGEST),
            "step": run.state["position"]["step"],
        },
        "parity": checked,
        "torch": torch.__version__,
    }


def main(argv: list[str]) -> None:
    warnings_to_stderr()
    try:
        args = arguments(argv, ARGUMENTS)
        fmt, weights = args.get("format"), args.get("weights", "model")
        check_choices(fmt, weights, args.get("tolerance", 1e-4))
        overwrite = args.get("overwrite", False)
        out = output_file(str(args.get("out", f"model{SUFFIXES[fmt]}")), overwrite)
        output_file(f"{out}.json", overwrite)
        with offline(f"the config comes from ckpt={args.ckpt}"):
            record = export_checkpoint(
                Path(str(args.ckpt)),
                fmt,
                out,
                weights,
                args.get("images"),
                OmegaConf.select(args, "data.root"),
                args.get("tolerance", 1e-4),
                args.get("trust", False),
            )
    except UserError as error:
        exit_with(error)
    checked = record["parity"]
    if "max_abs_diff" in checked:
        sizes = ", ".join(map(str, checked["batch_sizes"]))
        shown = f"logits within {checked['max_abs_diff']:.2g} of PyTorch's (allowed "
        shown += f"{checked['allowed']:.2g}) on {checked['images']} images, batch sizes {sizes}"
    else:
        shown = checked["check"]
    print(f"{fmt}: {out} and {out.name}.json ({record['weights']} weights; {shown})")
