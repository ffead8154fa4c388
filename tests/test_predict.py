"""python -m repro.predict, and repro.evaluate per class: a trained checkpoint's classes."""

from __future__ import annotations

import csv
import errno
import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from repro import evaluate
from repro.core.errors import CheckpointError, ConfigError, DataError
from repro.core.restore import checkpoint_file, output_file, write_result
from repro.predict import predict_files

from conftest import IMAGEFOLDER, SHAPES, make_image_tree, run_cli, tiny, train_in_process


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run on a tree of PNGs of uneven sizes, and that tree."""
    images = make_image_tree(tmp_path_factory.mktemp("tree") / "images")
    run_dir = tmp_path_factory.mktemp("run")
    train_in_process(run_dir, *IMAGEFOLDER, f"data.root={images}", "trainer.tta=flip")
    return run_dir / "checkpoints" / "last.pt", images


def test_predictions_name_the_classes_and_agree_with_evaluate(trained):
    ckpt, images = trained
    rows = predict_files(ckpt, images / "val", top_k=2)
    assert len(rows) == 3 * 12 and all(row["class"] in SHAPES for row in rows)
    assert all(row["probability"] >= row["probability_2"] for row in rows)
    # The val folder is the run's validation split: the same accuracy as repro.evaluate's,
    # through the same transform, model and test-time flips.
    correct = sum(row["path"].split("/")[-2] == row["class"] for row in rows)
    assert correct / len(rows) == evaluate.evaluate_checkpoint(ckpt, split="val")["acc"]
    path = images / "val" / "bar" / "0.png"
    (alone,) = predict_files(ckpt, path)
    (among,) = [row for row in rows if row["path"] == str(path)]
    assert alone["class"] == among["class"]
    assert alone["probability"] == pytest.approx(among["probability"], abs=1e-4)


def test_evaluate_and_predict_take_a_run_folder_as_export_does(trained):
    ckpt, images = trained
    run_dir = ckpt.parents[1]
    tested, weights = checkpoint_file(run_dir)  # the weights the run tested: its best
    assert tested == run_dir / "checkpoints" / "best.pt" and weights == "model"
    scores = evaluate.evaluate_checkpoint(run_dir, split="val")
    assert scores == evaluate.evaluate_checkpoint(tested, split="val")
    bars = images / "val" / "bar"
    assert predict_files(run_dir, bars) == predict_files(tested, bars)


@pytest.mark.slow
def test_the_command_writes_its_csv_and_refuses_bad_arguments(trained, tmp_path):
    ckpt, images = trained
    out = tmp_path / "predictions.csv"
    done = run_cli("repro.predict", f"ckpt={ckpt}", f"images={images / 'val'}", f"out={out}")
    assert done.returncode == 0, done.stderr
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 36 and list(rows[0]) == ["path", "class", "probability"]
    written, fresh = out.read_bytes(), tmp_path / "unwritten.csv"
    unmade = tmp_path / "unmade" / "p.csv"  # its folder is made only when the CSV is written
    refused = [
        ([f"ckpt={ckpt}", f"images={images}", f"out={out}"], "does not exist yet"),
        ([f"ckpt={ckpt}", f"images={images}", f"out={tmp_path}"], "this is a folder"),
        ([f"ckpt={ckpt}", f"images={images}", f"out={out}", "overwrite=maybe"], "overwrite="),
        ([f"images={images}"], "ckpt"),
        ([f"ckpt={ckpt}"], "images"),
        ([f"ckpt={ckpt}", f"images={tmp_path / 'none'}", f"out={unmade}"], "no such file"),
        ([f"ckpt={ckpt}", f"images={images}", f"out={out / 'p.csv'}"], "not a writable folder"),
        ([f"ckpt={ckpt}", f"images={images}", "top_k=4", f"out={fresh}"], "top_k=4"),
    ]
    for args, message in refused:
        bad = run_cli("repro.predict", *args)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr
    assert out.read_bytes() == written and not fresh.exists()  # refused: nothing written
    assert not unmade.parent.exists()
    args = f"ckpt={ckpt}", f"images={images / 'val' / 'bar'}", f"out={out}", "overwrite=true"
    assert run_cli("repro.predict", *args).returncode == 0
    assert out.read_text().count("\n") == 1 + 12
    nested = tmp_path / "new" / "folder" / "p.csv"  # a missing folder is made
    assert (
        run_cli("repro.predict", f"ckpt={ckpt}", f"images={images}", f"out={nested}").returncode
        == 0
    )


def test_an_empty_folder_is_refused(trained, tmp_path):
    with pytest.raises(DataError, match="no image files"):
        predict_files(trained[0], tmp_path)
    with pytest.raises(ConfigError, match="top_k"):
        predict_files(trained[0], trained[1] / "val", top_k=0)


def test_per_class_accuracy_and_the_confusion_matrix_add_up(trained):
    ckpt, _ = trained
    result = evaluate.evaluate_checkpoint(ckpt, split="val", per_class=True)
    confusion = result["confusion"]
    assert len(confusion) == 3 and sum(map(sum, confusion)) == result["images"] == 36
    assert sum(confusion[i][i] for i in range(3)) / 36 == result["acc"]
    assert [row["class"] for row in result["per_class"]] == sorted(SHAPES)
    assert all(row["images"] == 12 for row in result["per_class"])
    rows = predict_files(ckpt, trained[1] / "val")  # the same predictions, file by file
    for index, name in enumerate(sorted(SHAPES)):
        mine = [row for row in rows if row["path"].split("/")[-2] == name]
        assert [sum(row["class"] == other for row in mine) for other in sorted(SHAPES)] == (
            confusion[index]
        )


def test_out_is_checked_without_making_anything(tmp_path, capsys):
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="not a writable folder"):
        output_file(str(tmp_path / "dangling" / "p.csv"))
    assert output_file(str(tmp_path / "missing" / ".." / "q.csv")) == tmp_path / "q.csv"
    nested = output_file(str(tmp_path / "a" / "b" / "r.csv"))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["dangling"]  # nothing made
    write_result(nested, "x\n")  # the folder is made when the result is written
    assert nested.read_text() == "x\n"
    late = output_file(str(tmp_path / "c" / "s.csv"))
    (tmp_path / "c").write_text("a file where the folder would go, made after the check\n")
    with pytest.raises(SystemExit) as stopped:
        write_result(late, "x\n")
    assert stopped.value.code == 2 and "error: cannot write" in capsys.readouterr().err


def test_a_result_the_disk_refuses_is_one_line_and_no_file(tmp_path, capsys, monkeypatch):
    out = output_file(str(tmp_path / "p.csv"))

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(SystemExit) as stopped:
        write_result(out, "x\n")
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and line.startswith(f"error: cannot write {out}: ")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("tested", ["last", "ema"])
def test_a_run_folder_gives_the_weights_its_test_used(tested, tmp_path):
    """Evaluated from its folder, a run's test split gives the figures its own test gave."""
    extra = ["+components=ema", "components.ema.decay=0.9"] if tested == "ema" else []
    summary = train_in_process(tmp_path, *tiny(f"trainer.test_weights={tested}", *extra))
    assert summary["test_weights"] == tested
    assert checkpoint_file(tmp_path) == (tmp_path / "checkpoints" / "last.pt",
                                         "ema" if tested == "ema" else "model")  # fmt: skip
    again = evaluate.evaluate_checkpoint(tmp_path, split="test")
    assert again["acc"] == summary["test_acc"]
    assert again["loss"] == pytest.approx(summary["test_loss"], rel=1e-6)
    if tested == "ema":  # not the trained weights': those give other figures
        trained_weights = evaluate.evaluate_checkpoint(
            tmp_path / "checkpoints" / "last.pt", split="test"
        )
        assert trained_weights["loss"] != again["loss"]


# ---- runs/restore.py's units: which file and weights, the arguments, the stored config ------


def fake_run_folder(folder, summary=None, files=("best.pt", "last.pt")):
    (folder / "checkpoints").mkdir(parents=True)
    for name in files:
        (folder / "checkpoints" / name).write_bytes(b"")
    if summary is not None:
        (folder / "summary.json").write_text(summary)
    return folder


@pytest.mark.parametrize(
    ("summary", "files", "chosen"),
    [('{"test_weights": "best"}', ("best.pt", "last.pt"), ("best.pt", "model")),
     ('{"test_weights": "best"}', ("last.pt",), ("last.pt", "model")),
     ('{"test_weights": "last"}', ("best.pt", "last.pt"), ("last.pt", "model")),
     ('{"test_weights": "ema"}', ("best.pt", "last.pt"), ("last.pt", "ema")),
     ('{"test_weights": "other"}', ("best.pt", "last.pt"), ("best.pt", "model")),
     ("[1]", ("best.pt", "last.pt"), ("best.pt", "model")),
     ("{", ("last.pt",), ("last.pt", "model")),
     (None, ("best.pt", "last.pt"), ("best.pt", "model"))],
)  # fmt: skip
def test_a_run_folders_file_and_weights_follow_its_summary(tmp_path, summary, files, chosen):
    from repro.core.restore import checkpoint_file

    run_dir = fake_run_folder(tmp_path / "run", summary, files)
    name, weights = chosen
    assert checkpoint_file(run_dir) == (run_dir / "checkpoints" / name, weights)
    assert checkpoint_file(run_dir / "checkpoints") == (run_dir / "checkpoints" / name, weights)
    assert checkpoint_file(run_dir / "x.pt") == (run_dir / "x.pt", "model")


def test_a_folder_without_checkpoints_is_one_line_naming_what_it_lacks(tmp_path):
    from repro.core.restore import checkpoint_file

    run_dir = fake_run_folder(tmp_path / "run", '{"test_weights": "last"}', ("best.pt",))
    with pytest.raises(CheckpointError) as refused:
        checkpoint_file(run_dir)
    assert str(refused.value) == f"{run_dir}: a folder with no checkpoints/best.pt or last.pt in it"


def test_the_weights_a_run_tested_are_taken_from_where_its_checkpoint_keeps_them():
    from repro.core.restore import _weights

    state = {"model": {"w": 1}, "components": {"ema": {"w": 2}}, "ema": {"w": 3}}
    assert _weights(state, "model", Path("c.pt")) == {"w": 1}
    assert _weights(state, "ema", Path("c.pt")) == {"w": 2}
    assert _weights({"ema": {"w": 3}, "components": None}, "ema", Path("c.pt")) == {"w": 3}
    with pytest.raises(CheckpointError) as refused:
        _weights({"components": {"ema": [1]}}, "ema", Path("runs/c.pt"))
    assert str(refused.value) == "runs/c.pt: its run tested a weight average the file does not hold"


def test_a_stored_config_builds_no_pretrained_weights_at_any_depth():
    from repro.core.restore import without_pretrained_weights

    stored = {"model": {"_target_": "timm.create_model", "pretrained": True, "weights": "x",
                        "backbone": {"_target_": "tv.resnet", "weights_backbone": "y", "n": 2},
                        "heads": [{"_target_": "h", "pretrained": True}, 3]},
              "data": {"weights": "kept: no _target_", "pretrained": True}}  # fmt: skip
    assert without_pretrained_weights(stored) == {
        "model": {"_target_": "timm.create_model", "pretrained": False, "weights": None,
                  "backbone": {"_target_": "tv.resnet", "weights_backbone": None, "n": 2},
                  "heads": [{"_target_": "h", "pretrained": False}, 3]},
        "data": {"weights": "kept: no _target_", "pretrained": True},
    }  # fmt: skip


def test_a_checkpoint_commands_arguments_are_refused_naming_the_allowed_keys():
    from repro.core.restore import arguments, classes_of

    args = arguments(["ckpt=a.pt", "out=x.csv", "top_k=2"], {"top_k"})
    assert (args.ckpt, args.out, args.top_k) == ("a.pt", "x.csv", 2)
    for argv, message in [
        (["ckpt=a.pt", "device=cuda"], "argument='device' is not allowed: use ckpt, out, "
         "overwrite, top_k, trust as key=value"),
        ([], "argument='(none)' is not allowed: use ckpt, out, overwrite, top_k, trust as "
         "key=value"),
        (["out=x.csv"], "ckpt=None is not allowed: a checkpoint or a run folder, e.g. "
         "ckpt=outputs/runs/<run> or .../last.pt"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError) as refused:
            arguments(argv, {"top_k"})
        assert str(refused.value) == message
    cfg = OmegaConf.create({"data": {"num_classes": "7"}})
    assert classes_of({"classes": ["a", "b"]}, cfg) == 2 and classes_of({}, cfg) == 7


def test_restore_refuses_an_unknown_tta_and_runs_fp16_weights_in_full_precision_here(
    trained, tmp_path
):
    from repro.core.restore import restore
    from repro.core.runs import integrity

    ckpt, _ = trained
    with pytest.raises(ConfigError) as refused:
        restore(ckpt, "cpu", tta="mirror")
    assert (
        str(refused.value)
        == "tta='mirror' is not allowed: choose one of none, flip, flip_translate"
    )
    state = torch.load(ckpt, weights_only=True)
    state["config"]["amp"]["mode"] = "fp16"  # trained on a GPU with fp16
    fp16 = tmp_path / "fp16.pt"
    torch.save(integrity.sealed(state), fp16)
    run = restore(fp16, "cpu", tta="none", trust=True)
    assert run.precision.mode == "off" and run.tta == "none" and run.checkpoint == fp16
    assert restore(ckpt, "cpu").tta == "flip"  # the run's own trainer.tta
    moved = restore(ckpt, "cpu", data_root=str(tmp_path))
    assert moved.cfg.data.root == str(tmp_path) and not moved.model.training


def test_each_refusal_of_out_is_word_for_word_and_an_existing_file_needs_overwrite(tmp_path):
    taken = tmp_path / "taken.csv"
    taken.write_text("x\n")
    (tmp_path / "file").write_text("")
    cases = [
        ((str(taken),), f"out='{taken}' is not allowed: a file that does not exist yet, or add "
         "overwrite=true"),
        ((str(tmp_path),), f"out='{tmp_path}' is not allowed: a file name; this is a folder"),
        ((str(taken), "yes"), "overwrite='yes' is not allowed: true or false"),
        ((str(tmp_path / "file" / "p.csv"),), f"out='{tmp_path / 'file' / 'p.csv'}' is not "
         f"allowed: a file in a folder that can be made ({tmp_path / 'file'} is not a writable "
         "folder)"),
    ]  # fmt: skip
    for args, message in cases:
        with pytest.raises(ConfigError) as refused:
            output_file(*args)
        assert str(refused.value) == message
    assert output_file(str(taken), True) == taken
    write_result(taken, "y\n")
    write_result(taken, "z\n")  # its folder exists already
    assert taken.read_text() == "z\n"
