"""runs/restore.py: a model back from a checkpoint written in the test (no training), which
file a run folder gives, the weights in it, and the checks every checkpoint command shares."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from repro.core import build, restore
from repro.core.errors import CheckpointError, ConfigError
from repro.core.runs.checkpoint import atomic_save
from repro.core.runs.trust import UntrustedConfigError
from repro.core.tasks.objectives import CrossEntropy

from conftest import compose_config, tiny, write_checkpoint

SEED = 7


def config(*overrides: str) -> dict:
    return OmegaConf.to_container(compose_config(*tiny(*overrides)), resolve=True)


def model_of(stored: dict, classes: int = 10) -> torch.nn.Module:
    return build.model(OmegaConf.create(stored), SEED, num_classes=classes)


def save(path: Path, stored: dict, **extra) -> dict:
    return write_checkpoint(path, stored, SEED, **extra)


@pytest.fixture(scope="module")
def stored() -> dict:
    return config("trainer.tta=flip", "objective.label_smoothing=0.1")


def same(first: dict, second: dict) -> bool:
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_a_checkpoint_file_gives_its_model_in_eval_mode_with_what_its_run_recorded(
    stored, tmp_path
):
    file = tmp_path / "elsewhere" / "model.pt"
    norm = {"mean": [0.1] * 3, "std": [0.2] * 3, "image_size": 32, "interpolation": "bilinear"}
    state = save(file, stored, classes=["a", "b", "c"], normalisation=norm)
    back = restore.restore(file, "cpu")
    assert same(back.model.state_dict(), state["model"]) and not back.model.training
    assert back.checkpoint == file and back.device == torch.device("cpu")
    assert back.tta == "flip" and back.normalisation == norm
    assert (
        back.state["classes"] == ["a", "b", "c"] and back.cfg.seed.value == stored["seed"]["value"]
    )
    assert isinstance(back.objective.objective, CrossEntropy)
    assert back.objective.objective.label_smoothing == 0.1
    assert back.memory_format.name == stored["memory_format"]["name"]
    assert back.precision.mode == "off" and back.cfg.data.root == stored["data"]["root"]
    images = torch.full((2, 3, 32, 32), 128, dtype=torch.uint8)
    on_device, _ = back.to_device(images, torch.zeros(2, dtype=torch.long))
    assert torch.allclose(on_device, torch.full_like(on_device, (128 / 255 - 0.1) / 0.2))


def test_the_data_root_tta_and_normalisation_can_be_given_or_left_to_the_run(stored, tmp_path):
    file = tmp_path / "last.pt"
    save(file, stored, classes=["a", "b", "c"])
    back = restore.restore(file, "cpu", data_root="/data/here", tta="none")
    assert back.cfg.data.root == "/data/here" and back.tta == "none"
    assert back.normalisation == build.normalisation(back.cfg)  # none recorded: data.*'s
    with pytest.raises(ConfigError) as refused:
        restore.restore(file, "cpu", tta="mirror")
    allowed = ", ".join(restore.config.CHOICES["trainer.tta"])
    assert str(refused.value) == f"tta='mirror' is not allowed: choose one of {allowed}"


def test_a_run_trained_in_fp16_runs_in_full_precision_on_a_cpu(tmp_path):
    file = tmp_path / "last.pt"
    save(file, config("amp=bf16"))
    assert restore.restore(file, "cpu").precision.mode == "bf16"
    stored = config()
    stored["amp"]["mode"] = "fp16"
    save(file, stored)
    assert restore.restore(file, "cpu").precision.mode == "off"


def test_a_checkpoint_from_before_the_objective_section_gets_its_old_label_smoothing(tmp_path):
    stored = config()
    del stored["objective"]
    stored["trainer"]["label_smoothing"] = 0.3
    file = tmp_path / "last.pt"
    save(file, stored)
    assert restore.restore(file, "cpu").objective.objective.label_smoothing == 0.3


def test_the_class_count_is_the_recorded_classes_else_the_datas():
    cfg = OmegaConf.create({"data": {"num_classes": 4}})
    assert restore.classes_of({"classes": ["x", "y"]}, cfg) == 2
    assert restore.classes_of({"classes": []}, cfg) == 4
    assert restore.classes_of({}, cfg) == 4


def test_weights_that_do_not_fit_the_model_are_one_line_naming_the_file(stored, tmp_path):
    file = tmp_path / "last.pt"
    state = save(file, stored, classes=["a", "b"])
    state["config"]["model"]["widths"] = [8, 32]  # the model it builds is wider
    atomic_save(state, file)
    with pytest.raises(CheckpointError) as refused:
        restore.restore(file, "cpu")
    said = str(refused.value)
    assert said.startswith(f"{file}: its weights do not fit the model its config builds (")
    assert "\n" not in said and said.endswith(
        "the shape in current model is torch.Size([10, 32]).)"
    )


def run_folder(tmp_path: Path, stored: dict, names: tuple[str, ...], summary=None) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    for name in names:
        save(run / "checkpoints" / name, stored)
    if summary is not None:
        (run / "summary.json").write_text(
            summary if isinstance(summary, str) else json.dumps(summary)
        )
    return run


@pytest.mark.parametrize(
    ("names", "summary", "chosen", "weights"),
    [
        (("best.pt", "last.pt"), {"test_weights": "best"}, "best.pt", "model"),
        (("best.pt", "last.pt"), {"test_weights": "last"}, "last.pt", "model"),
        (("best.pt", "last.pt"), {"test_weights": "ema"}, "last.pt", "ema"),
        (("last.pt",), {"test_weights": "best"}, "last.pt", "model"),
        (("best.pt", "last.pt"), None, "best.pt", "model"),
        (("last.pt",), None, "last.pt", "model"),
        (("best.pt", "last.pt"), {"test_weights": "other"}, "best.pt", "model"),
        (("best.pt", "last.pt"), ["test_weights", "last"], "best.pt", "model"),
        (("best.pt", "last.pt"), "{not json", "best.pt", "model"),
    ],
)
def test_a_run_folder_gives_the_weights_its_test_used(
    stored, tmp_path, names, summary, chosen, weights
):
    run = run_folder(tmp_path, stored, names, summary)
    expected = (run / "checkpoints" / chosen, weights)
    assert restore.checkpoint_file(run) == expected
    assert restore.checkpoint_file(run / "checkpoints") == expected


def test_a_folder_without_checkpoints_is_refused_and_a_file_is_itself(stored, tmp_path):
    run = run_folder(tmp_path, stored, (), {"test_weights": "last"})
    with pytest.raises(CheckpointError) as refused:
        restore.checkpoint_file(run)
    assert str(refused.value) == f"{run}: a folder with no checkpoints/best.pt or last.pt in it"
    assert restore.checkpoint_file(run / "x.pt") == (run / "x.pt", "model")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.pt").symlink_to(tmp_path / "nowhere.pt")  # the boundary says
    assert restore.checkpoint_file(run) == (run / "checkpoints" / "last.pt", "model")


def test_a_run_folder_that_tested_its_average_gives_the_average(stored, tmp_path):
    run = run_folder(tmp_path, stored, ("last.pt",), {"test_weights": "ema"})
    file = run / "checkpoints" / "last.pt"
    state = torch.load(file, weights_only=True)
    average = {k: v + 1 if v.is_floating_point() else v for k, v in state["model"].items()}
    state["components"] = {"ema": average}
    atomic_save(state, file)
    back = restore.restore(run, "cpu")
    assert same(back.model.state_dict(), average) and back.checkpoint == file


def test_the_weights_are_the_models_or_the_average_it_holds_now_or_held_at_the_top():
    model, average, older = (
        {"w": torch.ones(1)},
        {"w": torch.zeros(1)},
        {"w": torch.full((1,), 2.0)},
    )
    state = {"model": model, "components": {"ema": average}, "ema": older}
    assert restore._weights(state, "model", Path("x.pt")) is model
    assert restore._weights(state, "ema", Path("x.pt")) is average
    assert restore._weights({"model": model, "ema": older}, "ema", Path("x.pt")) is older
    assert restore._weights({"components": None, "ema": older}, "ema", Path("x.pt")) is older
    for without in ({"model": model}, {"components": {"ema": [1]}}):
        with pytest.raises(CheckpointError) as refused:
            restore._weights(without, "ema", Path("x.pt"))
        assert str(refused.value) == "x.pt: its run tested a weight average the file does not hold"


def test_no_model_part_at_any_depth_fetches_pretrained_weights():
    stored = {
        "model": {
            "_target_": "m.Net",
            "pretrained": True,
            "weights": "IMAGENET1K_V1",
            "backbone": {"_target_": "m.Backbone", "weights_backbone": "x", "width": 3},
            "heads": [{"_target_": "m.Head", "pretrained": "file.pt"}, 4],
        },
        "data": {"pretrained": True, "weights": "kept: no target here"},
    }
    assert restore.without_pretrained_weights(stored) == {
        "model": {
            "_target_": "m.Net",
            "pretrained": False,
            "weights": None,
            "backbone": {"_target_": "m.Backbone", "weights_backbone": None, "width": 3},
            "heads": [{"_target_": "m.Head", "pretrained": False}, 4],
        },
        "data": {"pretrained": True, "weights": "kept: no target here"},
    }
    assert stored["model"]["pretrained"] is True  # a copy: the record is left as it was


def test_a_command_takes_the_shared_arguments_and_its_own_and_requires_a_checkpoint():
    args = restore.arguments(["ckpt=runs/a", "out=p.csv", "overwrite=true", "k=3"], {"k"})
    assert (args.ckpt, args.out, args.overwrite, args.k) == ("runs/a", "p.csv", True, 3)
    assert restore.arguments(["ckpt=x", "trust=false"], set()).trust is False
    allowed = "use ckpt, k, out, overwrite, trust as key=value"
    for argv, named in ((["ckpt=x", "z=1", "y=2"], "y"), ([], "(none)"), (["ckpt"], "(none)")):
        with pytest.raises(ConfigError) as refused:
            restore.arguments(argv, {"k"})
        assert (refused.value.key, refused.value.value) == ("argument", named)
        assert refused.value.allowed == allowed
    with pytest.raises(ConfigError) as refused:
        restore.arguments(["out=p.csv"], {"k"})
    assert str(refused.value) == (
        "ckpt=None is not allowed: a checkpoint or a run folder, e.g. ckpt=outputs/runs/<run> "
        "or .../last.pt"
    )


def test_the_output_file_is_checked_before_any_work_and_nothing_is_made(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert restore.output_file("new/deeper/p.csv") == Path("new/deeper/p.csv")
    assert not Path("new").exists()
    assert restore.output_file("missing/../q.csv") == Path("q.csv")
    Path("p.csv").write_text("kept")
    assert restore.output_file("p.csv", overwrite=True) == Path("p.csv")
    refusals = [
        (
            ("p.csv",),
            "out='p.csv' is not allowed: a file that does not exist yet, or add overwrite=true",
        ),
        (("p.csv", "yes"), "overwrite='yes' is not allowed: true or false"),
        ((".",), "out='.' is not allowed: a file name; this is a folder"),
        (
            ("p.csv/x.csv",),
            "out='p.csv/x.csv' is not allowed: a file in a folder that can be made "
            f"({tmp_path / 'p.csv'} is not a writable folder)",
        ),
    ]
    for given, said in refusals:
        with pytest.raises(ConfigError) as refused:
            restore.output_file(*given)
        assert str(refused.value) == said
    Path("dangling").symlink_to(tmp_path / "gone")
    with pytest.raises(ConfigError, match=r"\(.*dangling is not a writable folder\)"):
        restore.output_file("dangling/r.csv")
    assert Path("p.csv").read_text() == "kept"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in any folder")
def test_a_folder_that_cannot_be_written_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(ConfigError, match="is not a writable folder"):
        restore.output_file(str(locked / "p.csv"))


def test_a_result_is_written_with_its_folders_and_a_refusing_disk_is_one_line(tmp_path, capsys):
    out = tmp_path / "a" / "b" / "p.csv"
    restore.write_result(out, "x,y\n")
    assert out.read_text() == "x,y\n"
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(SystemExit) as ended:
        restore.write_result(tmp_path / "file" / "p.csv", "x")
    assert ended.value.code == 2
    said = capsys.readouterr().err
    assert said.startswith("error: ") and said.count("\n") == 1 and "file/p.csv" in said


def test_a_restored_run_loads_a_split_in_its_order_in_batches_of_the_size_asked(stored, tmp_path):
    from repro.core.data.loader import Batches
    from repro.core.data.sources import TensorImages

    file = tmp_path / "last.pt"
    save(file, stored)
    back = restore.restore(file, "cpu")
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (10, 3, 32, 32), dtype=torch.uint8, generator=generator)
    source = TensorImages(images, torch.arange(10) % 3)
    _, transform = build.pipelines(back.cfg, False, False, back.normalisation)
    loader = back.loader(source, transform, 4)
    with Batches(loader) as batches:
        got = list(batches.take(len(loader)))
    assert [len(labels) for _, labels in got] == [4, 4, 2] and not loader.pin_memory
    assert torch.equal(torch.cat([labels for _, labels in got]), source.labels)
    assert torch.equal(torch.cat([batch for batch, _ in got]), images)  # 32 pixels: as stored
    default = back.cfg.trainer.eval_batch_size
    assert len(back.loader(source, transform, None)) == -(-10 // default)


def test_an_output_under_a_file_is_refused_even_one_that_can_be_run(tmp_path):
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    with pytest.raises(ConfigError) as refused:
        restore.output_file(str(tool / "p.csv"))
    assert (
        refused.value.allowed
        == f"a file in a folder that can be made ({tool} is not a writable folder)"
    )


def test_a_result_goes_into_a_folder_that_is_already_there(tmp_path):
    restore.write_result(tmp_path / "p.csv", "a\n")
    restore.write_result(tmp_path / "p.csv", "b\n")
    assert (tmp_path / "p.csv").read_text() == "b\n"


def test_an_argument_may_hold_equals_signs_in_its_value():
    assert restore.arguments(["ckpt=runs/a=b"], set()).ckpt == "runs/a=b"


def test_by_default_a_checkpoint_is_read_on_the_best_device_here_and_trusts_nothing(tmp_path):
    stored = config()
    file = tmp_path / "last.pt"
    save(file, stored)
    assert restore.restore(file).device == torch.device("cpu")  # auto, on a machine without GPU
    state = save(file, stored)
    state["config"]["model"]["_target_"] = "collections.OrderedDict"  # harmless, not trusted
    atomic_save(state, file)
    with pytest.raises(UntrustedConfigError) as refused:
        restore.restore(file, "cpu")
    assert str(refused.value).startswith(f"{file}: model._target_='collections.OrderedDict' is not")
    with pytest.raises(Exception) as built:  # trusted: it gets as far as building
        restore.restore(file, "cpu", trust=True)
    assert not isinstance(built.value, UntrustedConfigError)


def test_a_checkpoint_without_a_config_is_refused_as_holding_none(tmp_path):
    file = tmp_path / "last.pt"
    state = save(file, config())
    del state["config"]
    atomic_save(state, file)
    with pytest.raises(UntrustedConfigError) as refused:
        restore.restore(file, "cpu")
    assert str(refused.value) == f"{file}: holds no config (a mapping of keys to values)"


def test_a_model_that_takes_its_class_count_from_the_data_gets_the_recorded_classes(tmp_path):
    stored = config()
    stored["model"]["num_classes"] = None
    stored["data"]["num_classes"] = None
    file = tmp_path / "last.pt"
    save(file, stored, classes=["a", "b", "c"])
    back = restore.restore(file, "cpu")
    assert back.model(torch.zeros(1, 3, 32, 32)).shape == (1, 3)


def test_a_run_folder_that_tested_an_average_it_does_not_hold_is_named(tmp_path):
    run = run_folder(tmp_path, config(), ("last.pt",), {"test_weights": "ema"})
    with pytest.raises(CheckpointError) as refused:
        restore.restore(run, "cpu")
    file = run / "checkpoints" / "last.pt"
    assert str(refused.value) == f"{file}: its run tested a weight average the file does not hold"


def test_a_checkpoint_with_a_second_link_in_its_own_run_folder_or_file_folder_is_read(tmp_path):
    run = run_folder(tmp_path, config(), ("best.pt",), {"test_weights": "best"})
    os.link(run / "checkpoints" / "best.pt", run / "kept.pt")  # inside the folder named
    assert restore.restore(run, "cpu").checkpoint == run / "checkpoints" / "best.pt"
    file = tmp_path / "alone" / "model.pt"
    save(file, config())
    os.link(file, file.parent / "copy.pt")  # the file's own folder holds both of its names
    assert restore.restore(file, "cpu").checkpoint == file
