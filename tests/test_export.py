"""python -m repro.export: ONNX (run in onnxruntime), TorchScript and safetensors files of
trained checkpoints that give PyTorch's logits on real images, and one-line refusals."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from repro.core import build
from repro.core.errors import CheckpointError, ConfigError, DataError
from repro.core.restore import restore
from repro.core.runs.checkpoint import load
from repro.core.runs.integrity import KEY as DIGEST
from repro.core.runs.trust import UntrustedConfigError
from repro.export.command import export_checkpoint, main
from repro.export.formats import ExportError

from conftest import (
    IMAGEFOLDER,
    ROOT,
    TINY,
    draw_shape,
    make_image_tree,
    run_cli,
    tiny,
    train_in_process,
)

# Small, quick runs of the larger models: 16x16 images, two steps, no test after training.
QUICK = [
    *(o for o in TINY if not o.startswith("model.")),
    "data.image_size=16", "data.resize=16", "data.val_size=64", "trainer.batch_size=16",
    "trainer.max_steps=2", "trainer.test_after_fit=false", "optimizer.lr=0.01",
]  # fmt: skip
MODELS = {
    "small_cnn": tiny("+components=ema"),
    "resnet18_cifar": [*QUICK, "model=resnet18_cifar"],
    # The lead switches this to `model=timm model.name=resnet18` once that config is merged.
    "timm": [*QUICK, "model=torchvision", "model._target_=timm.create_model",
             "+model.model_name=resnet18"],
}  # fmt: skip
# The `export` extra, which `make` installs: without it the ONNX tests are skipped.
NEEDS_ONNX = pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("onnxruntime", "onnxscript")),
    reason="onnxruntime and onnxscript (the export extra) are not installed",
)
DOCS = (ROOT / "docs" / "export.md").read_text()
TRUSTED = {"small_cnn": False, "resnet18_cifar": False, "timm": True}  # timm: not in conf/ yet


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run folders of the three models, trained when first asked for."""
    made = {}

    def run(name):
        if name not in made:
            made[name] = tmp_path_factory.mktemp(name)
            train_in_process(made[name], *MODELS[name])
        return made[name]

    return run


def pytorch_logits(ckpt, trust=False, weights="model"):
    """The first 64 images of the run's validation split (float, in [0, 1]), and PyTorch's
    logits on them, normalised as the run evaluates."""
    run = restore(ckpt, "cpu", trust=trust)
    if weights == "ema":
        run.model.load_state_dict(run.state["components"]["ema"])
    data = build.splits(run.cfg, run.state["root_seed"])
    _, transform = build.pipelines(run.cfg)
    pixels = torch.stack([transform(data.val[index][0], None) for index in range(64)])
    with torch.no_grad():
        logits = run.model(run.to_device(pixels, torch.zeros(64))[0])
    return pixels.float() / 255, logits


def in_onnxruntime(path):
    """The ONNX file run by onnxruntime on the CPU, as a function of a batch of images."""
    import onnxruntime  # the export extra: tests that call this are marked NEEDS_ONNX

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda images: torch.from_numpy(session.run(None, {"images": images.numpy()})[0])


def assert_agree(got, expected):
    assert got.shape == expected.shape
    assert (got - expected).abs().max() <= 1e-4 * max(1, expected.abs().max())


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning")
@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("fmt", [pytest.param("onnx", marks=NEEDS_ONNX), "torchscript"])
@pytest.mark.slow
def test_the_exported_model_gives_pytorchs_logits_on_64_real_images(runs, name, fmt, tmp_path):
    run_dir = runs(name)
    out = tmp_path / "exported" / f"model.{fmt}"
    record = export_checkpoint(run_dir, fmt, out, trust=TRUSTED[name])
    parity = record["parity"]
    assert parity["images"] == 64 and parity["batch_sizes"] == [1, 17, 64]
    assert parity["max_abs_diff"] <= parity["allowed"] == 1e-4 * max(1, parity["max_abs_logit"])
    # The file on disk, read back here, at batch sizes 1 and 17 (the batch axis is dynamic).
    images, expected = pytorch_logits(run_dir / "checkpoints" / "best.pt", TRUSTED[name])
    exported = in_onnxruntime(out) if fmt == "onnx" else torch.jit.load(str(out))
    for size in (1, 17, 64):
        assert_agree(exported(images[:size]), expected[:size])
    sidecar = json.loads((tmp_path / "exported" / f"model.{fmt}.json").read_text())
    assert sidecar == record and sidecar["format"] == fmt and sidecar["weights"] == "model"
    size = 32 if name == "small_cnn" else 16
    assert sidecar["input"]["shape"] == ["batch", 3, size, size]
    assert sidecar["input"]["range"] == [0, 1] and sidecar["normalisation"]["folded_in"]
    assert sidecar["output"]["shape"] == ["batch", 10] and len(sidecar["classes"]) == 10
    state = load(run_dir / "checkpoints" / "best.pt")
    assert sidecar["normalisation"]["mean"] == state["config"]["data"]["mean"]
    assert sidecar.get("opset") == (18 if fmt == "onnx" else None)
    assert sidecar["source"]["content_sha256"] == state["content_sha256"]
    assert sidecar["source"]["checkpoint"].endswith("checkpoints/best.pt")


@NEEDS_ONNX
@pytest.mark.slow
def test_weights_ema_exports_the_average(runs, tmp_path):
    run_dir = runs("small_cnn")
    out = tmp_path / "ema.onnx"
    assert export_checkpoint(run_dir, "onnx", out, weights="ema")["weights"] == "ema"
    images, average = pytorch_logits(run_dir / "checkpoints" / "best.pt", weights="ema")
    got = in_onnxruntime(out)(images)
    assert_agree(got, average)
    _, trained = pytorch_logits(run_dir / "checkpoints" / "best.pt")
    assert (got - trained).abs().max() > 1e-3  # the average, not the trained weights
    with pytest.raises(CheckpointError, match=r"no weight average for weights=ema"):
        export_checkpoint(runs("resnet18_cifar"), "onnx", tmp_path / "none.onnx", weights="ema")
    assert not (tmp_path / "none.onnx").exists()


def test_safetensors_holds_the_models_own_weights_bit_for_bit(runs, tmp_path):
    run_dir = runs("small_cnn")
    out = tmp_path / "model.safetensors"
    record = export_checkpoint(run_dir / "checkpoints" / "last.pt", "safetensors", out)
    trained = load(run_dir / "checkpoints" / "last.pt")["model"]
    weights = load_file(str(out))
    assert weights.keys() == trained.keys()
    assert all(torch.equal(weights[key], trained[key]) for key in trained)
    assert record["parity"] == {"check": "every tensor read back equal"}
    assert not record["normalisation"]["folded_in"] and record["normalisation"]["std"] == [0.25] * 3


@NEEDS_ONNX
def test_image_files_stand_in_for_data_that_is_not_here(tmp_path):
    tree = make_image_tree(tmp_path / "tree", 4)
    run_dir = tmp_path / "run"
    last = "trainer.test_weights=last"  # 12 validation images: too few to select by
    train_in_process(run_dir, *IMAGEFOLDER, f"data.root={tree}", "trainer.epochs=1", last)
    shutil.rmtree(tree)  # the run's data, gone (another machine)
    with pytest.raises(DataError, match=r"parity check needs real images: give images=FOLDER"):
        export_checkpoint(run_dir, "onnx", tmp_path / "m.onnx")
    images = make_image_tree(tmp_path / "elsewhere", 3, side=40)  # 18 files, cut to 32x32
    record = export_checkpoint(run_dir, "onnx", tmp_path / "m.onnx", images=str(images))
    assert record["parity"]["images"] == 64 and record["parity"]["batch_sizes"] == [1, 17, 64]
    assert record["parity"]["images_from"] == f"{images} (18 files), repeated to 64"
    assert record["classes"] == ["bar", "blank", "circle"] and record["input"]["shape"][2:] == [
        32,
        32,
    ]
    assert record["normalisation"]["resize"] == 36 and record["output"]["shape"] == ["batch", 3]


@NEEDS_ONNX
def test_a_disagreement_beyond_the_tolerance_fails_and_leaves_nothing(runs, tmp_path):
    out = tmp_path / "new" / "folder" / "model.onnx"
    with pytest.raises(ExportError, match=r"disagrees with PyTorch.*tolerance=0 .*nothing written"):
        export_checkpoint(runs("small_cnn"), "onnx", out, tolerance=0)
    assert list(tmp_path.iterdir()) == []  # no file, no sidecar, no temporary, no folder


@NEEDS_ONNX
def test_a_model_onnx_cannot_express_is_one_error_naming_it_and_the_format(tmp_path):
    run_dir = tmp_path / "run"
    small = [o for o in tiny("trainer.max_steps=2") if not o.startswith("model.")]
    spectral = "model._target_=colleague_nets.spectral_net"
    train_in_process(run_dir, *small, "model=torchvision", spectral)
    out = tmp_path / "out" / "model.onnx"
    with pytest.raises(UntrustedConfigError, match=r"colleague_nets.spectral_net"):
        export_checkpoint(run_dir, "onnx", out)  # a colleague's code runs only with trust=true
    with pytest.raises(
        ExportError,
        match=r"model._target_='colleague_nets.spectral_net' cannot be exported as onnx \(.+\)",
    ):
        export_checkpoint(run_dir, "onnx", out, trust=True)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match=r"format='tflite'.*onnx or torchscript or safetensors"):
        export_checkpoint(run_dir, "tflite", out, trust=True)


def readme_command() -> str:
    """The README's export command (the block marked `tested: export`), as first typed."""
    text = (ROOT / "README.md").read_text()
    (block,) = re.findall(r"<!-- tested: export -->\n```bash\n(.*?)```", text, re.DOTALL)
    typed = re.sub(r"\s*\[[^\]]*\]", "", block.replace("\\\n", " "))  # options left out
    return re.sub(r"=(\w+)\|[\w|]+", r"=\1", typed).strip()  # `a|b|c`: the first, a


@NEEDS_ONNX
@pytest.mark.e2e
@pytest.mark.slow
def test_the_readme_command_exports_and_a_mistake_is_one_line(runs, tmp_path):
    run_dir = runs("small_cnn")
    words = shlex.split(readme_command())[2:]  # after `python -m`
    words = [re.sub(r"^ckpt=.*", f"ckpt={run_dir}", word) for word in words]
    out = tmp_path / "model.onnx"
    done = run_cli(*words, f"out={out}")
    assert done.returncode == 0, done.stderr
    assert "onnx: " in done.stdout and "on 64 images, batch sizes 1, 17, 64" in done.stdout
    assert json.loads((tmp_path / "model.onnx.json").read_text())["parity"]["images"] == 64
    # docs/export.md's consumer, with nothing of this repository: a class name for an image.
    (snippet,) = re.findall(r"<!-- tested: export-consumer -->\n```python\n(.*?)```", DOCS, re.S)
    draw_shape("circle", 32, 32, np.random.default_rng(0)).save(tmp_path / "image.png")
    consumer = subprocess.run(
        [sys.executable, "-I", "-c", snippet], cwd=tmp_path, capture_output=True, text=True
    )
    assert consumer.returncode == 0, consumer.stderr
    assert (
        consumer.stdout.strip() in json.loads((tmp_path / "model.onnx.json").read_text())["classes"]
    )
    bad = run_cli(*words, f"out={out}")
    assert (
        bad.returncode == 2
        and bad.stderr.startswith("error: out=")
        and "overwrite=true" in bad.stderr
    )
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_mistakes_are_one_line_each_and_write_nothing(runs, tmp_path, capsys):
    run_dir, foreign, fresh = runs("small_cnn"), tmp_path / "foreign.pt", tmp_path / "fresh.onnx"
    torch.save({"weights": torch.zeros(2)}, foreign)
    (tmp_path / "taken.onnx.json").write_text("{}")
    refused = [
        ([f"ckpt={tmp_path / 'missing.pt'}", "format=onnx"], "no such checkpoint file"),
        ([f"ckpt={foreign}", "format=onnx"], "not a repro checkpoint"),
        ([f"ckpt={tmp_path}", "format=onnx"], "no checkpoints/best.pt or last.pt"),
        ([f"ckpt={run_dir}"], "format=None is not allowed: onnx or torchscript or safetensors"),
        ([f"ckpt={run_dir}", "format=tflite"], "format='tflite' is not allowed"),
        ([f"ckpt={run_dir}", "format=onnx", "weights=swa"], "weights='swa' is not allowed"),
        ([f"ckpt={run_dir}", "format=onnx", "tolerance=-1"], "tolerance=-1 is not allowed"),
        ([f"ckpt={run_dir}", "format=onnx", "device=cuda"], "argument='device'"),
        ([f"ckpt={run_dir}", "format=onnx", f"out={tmp_path / 'taken.onnx'}"], "taken.onnx.json"),
        ([f"ckpt={runs('resnet18_cifar')}", "format=onnx", "weights=ema"], "no weight average"),
    ]
    for args, message in refused:
        with pytest.raises(SystemExit) as stopped:
            main([*args, *([] if "out=" in str(args) else [f"out={fresh}"])])
        error = capsys.readouterr().err
        assert stopped.value.code == 2 and message in error, error
        assert error.startswith("error: ") and error.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign.pt", "taken.onnx.json"]


# ---- the unit: the parity check (fast, in-process) -----------------------------------------


@pytest.mark.parametrize("offset", [-5.0, 5.0])
def test_parity_reports_the_largest_absolute_difference_whatever_its_sign(offset):
    from repro.export.formats import BATCH_SIZES, parity

    images = torch.rand(40, 3, 4, 4)
    expected = images.flatten(1)[:, :10] * 8 - 4  # logits in [-4, 4]

    def shifted(batch):  # every logit off by `offset`, one by 2 * offset
        out = batch.flatten(1)[:, :10] * 8 - 4 + offset
        out[0, 3] += offset
        return out

    found = parity(shifted, images, expected)
    assert found["max_abs_diff"] == pytest.approx(2 * abs(offset))
    assert found["max_abs_logit"] == pytest.approx(float(expected.abs().max()))
    assert found["batch_sizes"] == [*[s for s in BATCH_SIZES if s < 40], 40]
    assert (
        parity(lambda batch: batch.flatten(1)[:, :10] * 8 - 4, images, expected)["max_abs_diff"]
        == 0
    )


def test_parity_refuses_logits_of_another_shape():
    from repro.export.formats import parity

    images = torch.rand(5, 3, 4, 4)
    with pytest.raises(ExportError, match=r"shape \(1, 9\), not \(1, 10\)"):
        parity(lambda batch: torch.zeros(len(batch), 9), images, torch.zeros(5, 10))


# ---- the unit: each format's writer on a small model (fast, in-process) --------------------


def small_model():
    """A small convolutional classifier of 10 classes, in eval mode, with its own weights."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 10),
    ).eval()


def wrapped_model():
    from repro.export.formats import Normalised

    return Normalised(small_model(), [0.5, 0.4, 0.3], [0.25, 0.2, 0.3]).eval()


def test_normalised_holds_float32_statistics_shaped_for_nchw_batches():
    from repro.export.formats import Normalised

    model = small_model()
    wrapped = Normalised(model, [0, 1, 2], [1, 2, 4])  # a config may give whole numbers
    for name, values in (("mean", [0, 1, 2]), ("std", [1, 2, 4])):
        buffer = wrapped.state_dict()[name]
        assert buffer.dtype == torch.float32 and buffer.shape == (1, 3, 1, 1)
        assert buffer.flatten().tolist() == values
    images = torch.rand(5, 3, 6, 6)
    expected = model(
        (images - torch.tensor([0.0, 1, 2]).view(1, 3, 1, 1))
        / 2 ** torch.arange(3.0).view(1, 3, 1, 1)
    )
    got = wrapped(images)
    assert got.dtype == torch.float32 and torch.allclose(got, expected)


def test_a_missing_export_extra_is_named_with_the_command_that_installs_it(monkeypatch, tmp_path):
    from repro.export.formats import write

    images = torch.rand(4, 3, 8, 8)
    cases = [("onnx", "onnxscript", "onnxscript"), ("safetensors", "safetensors.torch", None)]
    for fmt, module, named in cases:
        monkeypatch.setitem(sys.modules, module, None)  # `import` of it fails: not installed
        with pytest.raises(ConfigError) as refused:
            write(fmt, wrapped_model(), images, tmp_path / f"model.{fmt}", "nets.Small")
        assert str(refused.value) == (
            f"format={fmt!r} is not allowed: needs the export extra "
            f"({named or module} is missing): `uv sync --extra export`"
        )
        assert (refused.value.key, refused.value.value) == ("format", fmt)
    assert list(tmp_path.iterdir()) == []


class _Failing(torch.nn.Module):
    """A model whose forward fails: `raise_` makes the error (its cause chain included)."""

    def __init__(self, raise_):
        super().__init__()
        self.raise_ = raise_

    def forward(self, images):
        self.raise_()


def _chained():
    try:
        try:
            raise KeyError("the innermost")
        except KeyError as inner:
            raise TypeError("in between") from inner
    except TypeError as middle:
        raise RuntimeError("the outermost") from middle


def _coloured():
    raise ValueError("\n\x1b[1;31m  no kernel\x1b[0m for aten::fft_rfft2\nsecond line\nthird  ")


def _long():
    raise NotImplementedError("x" * 250 + "\nmore")


def _empty():
    raise RuntimeError("")


@pytest.mark.parametrize(
    ("raise_", "reason"),
    [
        (_chained, "KeyError: 'the innermost'"),
        (_coloured, "ValueError: no kernel for aten::fft_rfft2"),
        (_long, "NotImplementedError: " + "x" * 200),
        (_empty, "RuntimeError: "),
    ],
)
def test_an_exporter_failure_is_one_line_naming_the_target_the_format_and_the_innermost_cause(
    raise_, reason, tmp_path
):
    from repro.export.formats import Normalised, write

    wrapped = Normalised(_Failing(raise_), [0.5] * 3, [0.25] * 3)
    with pytest.raises(ExportError) as refused:
        write("torchscript", wrapped, torch.rand(4, 3, 8, 8), tmp_path / "m.pt", "nets.Spectral")
    assert str(refused.value) == (
        f"model._target_='nets.Spectral' cannot be exported as torchscript ({reason})"
    )
    assert refused.value.__cause__ is None and refused.value.__suppress_context__


@pytest.mark.filterwarnings("error")  # TorchScript's deprecation warnings are kept in
def test_torchscript_gives_pytorchs_logits_at_every_batch_size_from_the_file(tmp_path, monkeypatch):
    from repro.export.formats import parity, write

    monkeypatch.chdir(tmp_path)  # a file named "None", say, would be written or read here
    wrapped, images = wrapped_model(), torch.rand(20, 3, 8, 8)
    out = tmp_path / "model.pt"
    run = write("torchscript", wrapped, images, out, "nets.Small")
    with torch.no_grad():
        expected = wrapped(images)
        found = parity(run, images, expected)
    assert found["batch_sizes"] == [1, 17, 20] and found["max_abs_diff"] <= 1e-5
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        again = torch.jit.load(str(out), map_location="cpu")  # the file itself, read anew
    for size in (1, 3, 20):
        assert torch.allclose(again(images[:size]), expected[:size], atol=1e-5)


class _Branching(torch.nn.Module):
    """A model that counts its calls and turns a tensor into a Python bool (the trace warns)."""

    def __init__(self):
        super().__init__()
        self.linear, self.calls = torch.nn.Linear(3, 10), 0

    def forward(self, images):
        self.calls += 1
        pooled = images.mean((2, 3))
        return self.linear(pooled if bool(pooled.sum() > 0) else -pooled)


def test_torchscript_traces_the_model_once_and_its_trace_warnings_reach_the_caller(
    tmp_path,
):
    from torch.jit import TracerWarning

    from repro.export.formats import Normalised, write

    model = _Branching()
    wrapped = Normalised(model, [0.0] * 3, [1.0] * 3).eval()
    with pytest.warns(TracerWarning, match="Python boolean"):
        run = write("torchscript", wrapped, torch.rand(4, 3, 8, 8), tmp_path / "m.pt", "nets.B")
    assert model.calls == 1  # no second run to check the trace: the parity check does that
    images = torch.rand(3, 3, 8, 8)
    with torch.no_grad():
        assert torch.allclose(run(images), model(images), atol=1e-6)


def test_safetensors_writes_the_models_weights_with_pytorchs_metadata(tmp_path, monkeypatch):
    from safetensors import safe_open

    from repro.export.formats import write

    monkeypatch.chdir(tmp_path)  # a file named "None", say, would be written here
    (tmp_path / "out").mkdir()
    wrapped, out = wrapped_model(), tmp_path / "out" / "model.safetensors"
    assert write("safetensors", wrapped, torch.rand(4, 3, 8, 8), out, "nets.Small") is None
    with safe_open(str(out), framework="pt") as stored:
        assert stored.metadata() == {"format": "pt"}
        assert set(stored.keys()) == set(wrapped.model.state_dict())
    weights = load_file(str(out))
    assert all(torch.equal(weights[k], v) for k, v in wrapped.model.state_dict().items())
    assert "mean" not in weights  # the normalisation is the consumer's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("change", ["a value", "a name"])
def test_weights_that_read_back_different_fail_naming_the_file(change, tmp_path, monkeypatch):
    import safetensors.torch

    from repro.export.formats import write

    real = safetensors.torch.load_file

    def altered(path, *args, **kwargs):
        loaded = real(path, *args, **kwargs)
        if change == "a value":
            loaded["5.bias"] = loaded["5.bias"] + 1e-3
        else:
            loaded["5.offset"] = loaded.pop("5.bias")
        return loaded

    monkeypatch.setattr(safetensors.torch, "load_file", altered)
    out = tmp_path / "model.safetensors"
    with pytest.raises(ExportError) as refused:
        write("safetensors", wrapped_model(), torch.rand(4, 3, 8, 8), out, "nets.Small")
    assert str(refused.value) == f"{out}: the weights read back differ from those written"


@NEEDS_ONNX
def test_onnx_file_has_named_input_and_output_a_dynamic_batch_and_opset_18(
    tmp_path, capfd, monkeypatch
):
    import onnx
    import onnxruntime

    from repro.export.formats import Normalised, parity, write

    class Renamed(Normalised):  # the file's input is `images` whatever forward calls it
        def forward(self, pixels):
            return super().forward(pixels)

    opened = []

    class Session(onnxruntime.InferenceSession):  # the parity check's own session
        def __init__(self, *args, **kwargs):
            opened.append(kwargs.get("providers"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", Session)
    monkeypatch.chdir(tmp_path)  # a file named "None", say, would be written or read here
    plain = wrapped_model()
    renamed = Renamed(plain.model, [0.5, 0.4, 0.3], [0.25, 0.2, 0.3]).eval()
    images = torch.rand(20, 3, 8, 8)
    with torch.no_grad():
        expected = plain(images)
    capfd.readouterr()
    for wrapped, name in ((plain, "plain.onnx"), (renamed, "renamed.onnx")):
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            run = write("onnx", wrapped, images, tmp_path / name, "nets.Small")
        assert not [w for w in warned if "provider" in str(w.message)]
        found = parity(run, images, expected)
        assert found["batch_sizes"] == [1, 17, 20] and found["max_abs_diff"] <= 1e-5
        model = onnx.load(str(tmp_path / name))
        assert [i.name for i in model.graph.input] == ["images"]
        assert [o.name for o in model.graph.output] == ["logits"]
        shapes = [
            [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in (*model.graph.input, *model.graph.output)
        ]
        assert shapes == [["batch", 3, 8, 8], ["batch", 10]]
        assert {o.domain: o.version for o in model.opset_import}[""] == 18
    assert opened == [["CPUExecutionProvider"]] * 2
    assert capfd.readouterr().out == ""  # the exporter's progress lines are not printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.onnx", "renamed.onnx"]


def test_parity_checks_each_batch_size_once():
    from repro.export.formats import parity

    seen = []

    def run(batch):
        seen.append(len(batch))
        return batch.flatten(1)[:, :10]

    for count, sizes in ((1, [1]), (17, [1, 17]), (18, [1, 17, 18])):
        images = torch.rand(count, 3, 4, 4)
        seen.clear()
        found = parity(run, images, images.flatten(1)[:, :10])
        assert found["batch_sizes"] == seen == sizes and found["images"] == count


# ---- the command's units: its checks, the weights, the normalisation, the sidecar, main ------


def fake_run(state=None, **data):
    """What `restore` returns, reduced to what the units read: a config and a checkpoint."""
    data = {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3], "image_size": 24, "resize": None,
            "num_classes": 7, **data}  # fmt: skip
    cfg = OmegaConf.create({"data": data, "model": {"_target_": "nets.small", "width": 8}})
    return SimpleNamespace(cfg=cfg, state={"position": {"step": 12}, **(state or {})}, model=None)


A_NUMBER = (
    "is not allowed: a number >= 0 (a share of the largest logit, or of 1 if that is smaller)"
)


@pytest.mark.parametrize(
    ("fmt", "weights", "tolerance", "message"),
    [
        ("tflite", "model", 1e-4, "format='tflite' is not allowed: onnx or torchscript or safetensors"),
        ("onnx", "swa", 1e-4, "weights='swa' is not allowed: model (the trained weights) or ema (their "
         "average)"),
        ("onnx", "model", -1, f"tolerance=-1 {A_NUMBER}"),
        ("onnx", "model", True, f"tolerance=True {A_NUMBER}"),
        ("onnx", "model", "1e-4", f"tolerance='1e-4' {A_NUMBER}"),
    ],
)  # fmt: skip
def test_the_exports_own_arguments_are_refused_naming_what_is_allowed(
    fmt, weights, tolerance, message
):
    from repro.export.command import check_choices

    with pytest.raises(ConfigError) as refused:
        check_choices(fmt, weights, tolerance)
    assert str(refused.value) == message


@pytest.mark.parametrize("tolerance", [0, 0.0, 3, 1e-4])
def test_any_number_from_zero_up_is_a_tolerance(tolerance):
    from repro.export.command import check_choices

    for fmt in ("onnx", "torchscript", "safetensors"):
        for weights in ("model", "ema"):
            check_choices(fmt, weights, tolerance)  # no error


@pytest.mark.parametrize("where", ["components", "before components"])
def test_weights_ema_loads_the_average_the_run_kept(where):
    from repro.export.command import load_weights

    model = torch.nn.Linear(2, 1)
    average = {key: torch.full_like(value, 7.0) for key, value in model.state_dict().items()}
    trained = {key: value.clone() for key, value in model.state_dict().items()}
    kept = {"components": {"ema": average}} if where == "components" else {"ema": average}
    run = SimpleNamespace(state={"components": {"other": {}}, **kept}, model=model)
    load_weights(run, "model", Path("c.pt"))  # the trained weights, as restored
    assert all(torch.equal(model.state_dict()[k], trained[k]) for k in trained)
    load_weights(run, "ema", Path("c.pt"))
    assert all(torch.equal(model.state_dict()[k], average[k]) for k in average)


@pytest.mark.parametrize("state", [{}, {"components": None}, {"components": {"teacher": {}}}])
def test_weights_ema_without_an_average_is_one_error_naming_the_file(state):
    from repro.export.command import load_weights

    run = SimpleNamespace(state=state, model=torch.nn.Linear(2, 1))
    with pytest.raises(CheckpointError) as refused:
        load_weights(run, "ema", Path("runs/a/last.pt"))
    assert str(refused.value) == (
        "runs/a/last.pt: holds no weight average for weights=ema (the run had no "
        "+components=ema); use weights=model"
    )


def test_the_normalisation_is_the_configs_unless_the_checkpoint_recorded_one():
    from repro.export.command import normalisation

    assert normalisation(fake_run(resize=28)) == {
        "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3], "image_size": 24,
        "interpolation": "bilinear", "resize": 28, "from": "config",
    }  # fmt: skip
    recorded = {"mean": [0.1, 0.2, 0.3], "std": [0.9, 0.8, 0.7], "image_size": 32,
                "interpolation": "bicubic"}  # fmt: skip
    assert normalisation(fake_run({"normalisation": recorded})) == {
        **recorded, "resize": None, "from": "checkpoint",
    }  # fmt: skip
    partial = {"mean": [0.1], "std": [0.9]}  # a size and interpolation left to the config
    assert normalisation(fake_run({"normalisation": partial})) == {
        **partial, "image_size": 24, "interpolation": "bilinear", "resize": None,
        "from": "checkpoint",
    }  # fmt: skip


@pytest.mark.parametrize("fmt", ["onnx", "torchscript", "safetensors"])
def test_the_sidecar_says_all_a_consumer_needs(fmt):
    from repro.export.command import normalisation, sidecar_record
    from repro.export.formats import OPSET

    classes = ["a", "b", "c"]
    run = fake_run({"classes": classes, DIGEST: "ab12", "position": {"step": 40}})
    norm = normalisation(run)
    checked = {"check": "every tensor read back equal"}
    out = Path("out/model.x")
    record = sidecar_record(run, fmt, out, Path("runs/a/best.pt"), "ema", norm, checked)
    folded = fmt != "safetensors"
    assert record == {
        "format": fmt,
        "file": "model.x",
        **({"opset": OPSET} if fmt == "onnx" else {}),
        "input": {
            "name": "images", "layout": "NCHW", "dtype": "float32", "channels": "RGB",
            "range": [0, 1] if folded else "(x - mean) / std, x in [0, 1]",
            "shape": ["batch", 3, 24, 24],
        },
        "output": {"name": "logits", "shape": ["batch", 3]},
        "normalisation": {**norm, "folded_in": folded},
        "classes": classes,
        "model": {"_target_": "nets.small", "width": 8},
        "weights": "ema",
        "source": {"checkpoint": "runs/a/best.pt", "content_sha256": "ab12", "step": 40},
        "parity": checked,
        "torch": torch.__version__,
    }  # fmt: skip
    assert list(record)[:2] == ["format", "file"]
    unnamed = sidecar_record(fake_run(), fmt, out, Path("c.pt"), "model", norm, checked)
    assert unnamed["output"]["shape"] == ["batch", 7] and unnamed["classes"] is None
    assert unnamed["source"]["content_sha256"] is None


def test_real_images_are_the_first_64_of_a_folder_repeated_through_the_eval_transform(tmp_path):
    from repro.export.command import real_images

    run_dir = tmp_path / "run"
    train_in_process(run_dir, *tiny("trainer.max_steps=1", "trainer.test_after_fit=false"))
    run = restore(run_dir, "cpu")
    folder = make_image_tree(tmp_path / "files", 2, side=40)  # 12 files of 40x40
    pixels, where = real_images(run, str(folder))
    assert where == f"{folder} (12 files), repeated to 64"
    size = run.cfg.data.image_size
    assert pixels.shape == (64, 3, size, size) and pixels.dtype == torch.uint8
    assert torch.equal(pixels[12:24], pixels[:12]) and not torch.equal(pixels[0], pixels[1])
    assert run.cfg.data.cache == "none"
    pixels, where = real_images(restore(run_dir, "cpu"), None)
    expected, _ = pytorch_logits(run_dir)
    assert where == "the run's validation split" and torch.equal(pixels.float() / 255, expected)


def test_main_writes_the_file_and_its_sidecar_and_says_so_in_one_line(
    runs, tmp_path, monkeypatch, capsys
):
    run_dir = runs("small_cnn")
    monkeypatch.chdir(tmp_path)
    main([f"ckpt={run_dir}", "format=safetensors"])
    said = "safetensors: model.safetensors and model.safetensors.json (model weights; every "
    assert capsys.readouterr().out == said + "tensor read back equal)\n"
    assert json.loads(Path("model.safetensors.json").read_text())["file"] == "model.safetensors"
    main([f"ckpt={run_dir}", "format=safetensors", "overwrite=true", "weights=ema"])
    assert "(ema weights; every tensor" in capsys.readouterr().out
    images = make_image_tree(tmp_path / "files", 2, side=40)
    main([f"ckpt={run_dir}", "format=torchscript", f"images={images}", "tolerance=0.5"])
    record = json.loads(Path("model.torchscript.pt.json").read_text())
    checked = record["parity"]
    assert checked["tolerance"] == 0.5 and checked["images_from"].startswith(str(images))
    assert capsys.readouterr().out == (
        f"torchscript: model.torchscript.pt and model.torchscript.pt.json (model weights; logits "
        f"within {checked['max_abs_diff']:.2g} of PyTorch's (allowed {checked['allowed']:.2g}) "
        "on 64 images, batch sizes 1, 17, 64)\n"
    )
    assert checked["allowed"] == 0.5 * max(1.0, checked["max_abs_logit"])


def test_main_passes_data_root_and_trust_on(tmp_path, monkeypatch, capsys):
    tree = make_image_tree(tmp_path / "tree", 4)
    run_dir = tmp_path / "run"
    folder = [o for o in IMAGEFOLDER if not o.startswith("model.")]
    spectral = "model._target_=colleague_nets.spectral_net"  # outside conf/: needs trust
    train_in_process(
        run_dir,
        *folder,
        f"data.root={tree}",
        "trainer.max_steps=2",
        "model=torchvision",
        spectral,
        "trainer.test_weights=last",  # 12 validation images: too few to select by
    )
    moved = tree.rename(tmp_path / "moved")  # another machine's path
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main([f"ckpt={run_dir}", "format=safetensors", f"data.root={moved}"])
    assert "colleague_nets.spectral_net" in capsys.readouterr().err
    main([f"ckpt={run_dir}", "format=torchscript", f"data.root={moved}", "trust=true"])
    record = json.loads(Path("model.torchscript.pt.json").read_text())
    assert record["parity"]["images_from"] == "the run's validation split, repeated to 64"
