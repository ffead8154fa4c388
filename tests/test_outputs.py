"""A real command-line run writes every promised file, and evaluate reads its checkpoint."""

from __future__ import annotations

import csv
import json

import pytest

from repro.core import build
from repro.core.files import atomic_path, write_text_atomic
from repro.core.runs.fingerprint_log import FingerprintLog

from conftest import compose_config, read_summary, run_cli, tiny

DEFAULT_COLUMNS = ("epoch", "step", "train_loss", "val_loss", "val_acc", "lr", "images_per_s",
                   "data_wait_frac", "train_s")  # fmt: skip


@pytest.mark.e2e
@pytest.mark.slow
def test_run_folder_holds_every_output(tmp_path):
    run_dir = tmp_path / "run"
    done = run_cli(
        "repro.train", *tiny("logger=tensorboard", "logger.plot=true", "trainer.epochs=2"),
        f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "done | val_acc" in done.stdout

    for name in ("config.yaml", "overrides.yaml", "hydra.yaml"):
        assert (run_dir / ".hydra" / name).is_file()
    log = (run_dir / "train.log").read_text()
    assert "epoch 2 step" in log and "done | val_acc" in log

    with (run_dir / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    # The default objective has no term but its total: the columns of every earlier version.
    assert tuple(rows[0]) == DEFAULT_COLUMNS
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    assert all(0 <= float(r["data_wait_frac"]) <= 1 and float(r["images_per_s"]) > 0 for r in rows)

    summary = read_summary(run_dir)
    for key in ("val_acc", "val_loss", "seed", "weights_sha256", "wall_s", "train_s", "env"):
        assert key in summary
    model = build.model(compose_config(*tiny()), 0)
    assert summary["parameters"] == sum(p.numel() for p in model.parameters())
    assert f"({summary['parameters'] / 1e6:.2f}M parameters)" in log
    assert len(summary["weights_sha256"]) == 64
    assert summary["val_acc"] == float(rows[-1]["val_acc"])
    for key in ("python", "torch", "torchvision", "cuda", "cudnn", "device_name", "git_commit"):
        assert key in summary["env"]
    assert summary["env"]["pythonhashseed"] == "0"
    assert isinstance(summary["env"]["git_dirty"], bool | None)

    assert (run_dir / "checkpoints" / "last.pt").is_file()
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert (run_dir / "curves.png").read_bytes().startswith(b"\x89PNG")
    assert (run_dir / "fingerprints.csv").read_text().count("\n") == summary["total_steps"]

    result_file = tmp_path / "eval.json"
    evaluated = run_cli(
        "repro.evaluate", f"ckpt={run_dir / 'checkpoints' / 'last.pt'}", "split=val",
        f"out={result_file}",
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    assert "val: loss" in evaluated.stdout
    result = json.loads(result_file.read_text())
    assert result["acc"] == summary["val_acc"]  # same model, same split, same numbers
    assert abs(result["loss"] - summary["val_loss"]) < 1e-9


@pytest.mark.e2e
@pytest.mark.slow
def test_evaluate_test_split_and_bad_arguments(tmp_path):
    run_dir = tmp_path / "run"
    assert run_cli("repro.train", *tiny(), f"hydra.run.dir={run_dir}").returncode == 0
    done = run_cli("repro.evaluate", f"ckpt={run_dir / 'checkpoints' / 'last.pt'}")
    assert done.returncode == 0 and "test: loss" in done.stdout and "128 images" in done.stdout
    for args, expected in [
        (["ckpt=/no/such.pt"], "no such checkpoint"),
        ([f"ckpt={run_dir / 'summary.json'}"], "not a checkpoint"),
        ([f"ckpt={run_dir / 'checkpoints' / 'last.pt'}", "split=dev"], "split='dev'"),
        (["checkpoint=x"], "argument='checkpoint'"),
        ([f"ckpt={run_dir / 'checkpoints' / 'last.pt'}", "tta=mirror"], "tta='mirror'"),
        ([f"ckpt={run_dir / 'checkpoints' / 'last.pt'}", "per_class=maybe"], "per_class="),
        (
            [f"ckpt={run_dir / 'checkpoints' / 'last.pt'}", f"out={run_dir / 'summary.json'}"],
            "does not exist yet",
        ),
    ]:
        bad = run_cli("repro.evaluate", *args)
        assert bad.returncode == 2 and expected in bad.stderr and "Traceback" not in bad.stderr


def test_a_file_is_replaced_whole_or_not_at_all(tmp_path):
    target = tmp_path / "summary.json"
    write_text_atomic(target, "first\n")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half of a new")
        raise RuntimeError("a crash while writing")
    assert target.read_text() == "first\n"
    write_text_atomic(target, "second\n")
    assert target.read_text() == "second\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # no temporary left


def test_the_fingerprint_log_keeps_every_bit_of_each_loss_and_truncates_by_step(tmp_path):
    log = FingerprintLog.of_run(tmp_path)
    losses = [2.302585092994046, 0.1 + 0.2, 1e-300]
    log.append(1, losses[:2])
    log.append(3, losses[2:], weights_sha256="ab" * 32)
    rows = log.read()
    assert [(r.step, float(r.loss), r.weights_sha256) for r in rows] == [
        (1, losses[0], ""), (2, losses[1], ""), (3, losses[2], "ab" * 32),
    ]  # fmt: skip
    log.truncate_after(2)
    assert log.read() == rows[:2]


# ---- the unit: metrics.csv across resumes with other callbacks (fast, in-process) ----------


def _row(step: int, **extra: float) -> dict[str, float]:
    base = {"epoch": 1, "step": step, "train_loss": 1.0, "val_loss": 1.0, "val_acc": 0.5,
            "lr": 0.1, "images_per_s": 10.0, "data_wait_frac": 0.0, "train_s": 1.0}  # fmt: skip
    return {**base, **extra}


def test_the_first_divergence_names_its_step_and_both_sides_over_the_common_steps():
    from repro.core.runs.fingerprint_log import Row, first_divergence

    a, b = "a" * 48 + "0" * 16, "b" * 48 + "1" * 16
    recorded = [Row(1, "0.5", ""), Row(2, "0.25", a), Row(3, "0.125", "")]
    assert first_divergence(recorded, recorded[:2]) is None  # a shorter rerun: its steps agree
    assert first_divergence(recorded[:1], recorded) is None
    rehashed = [recorded[0], Row(2, "0.25", b)]
    assert first_divergence(recorded, rehashed, ("before", "after")) == (
        f"step 2: weights hash {'a' * 16} before, {'b' * 16} after"
    )
    assert first_divergence(recorded, [Row(1, "0.5000001", "")]) == (
        "step 1: loss 0.5 recorded, 0.5000001 now"
    )
    assert first_divergence(recorded, [recorded[0], Row(2, "0.25", "")]) is None  # unhashed


def test_a_refused_fingerprint_append_names_the_file(tmp_path):
    from repro.core.errors import StorageError

    log = FingerprintLog(tmp_path / "gone" / "fingerprints.csv")  # its folder is not there
    with pytest.raises(StorageError) as refused:
        log.append(1, [0.5])
    assert str(refused.value).startswith(f"cannot write {log.path}: ")


def test_a_callback_added_on_resume_adds_its_column_and_one_dropped_leaves_blanks(tmp_path):
    from repro.core.watch.loggers import MetricsLog

    MetricsLog(tmp_path, tensorboard=False).row(_row(2))
    resumed = MetricsLog(tmp_path, tensorboard=False)  # a resume with a grad-norm callback
    resumed.row(_row(4, grad_norm=0.25))
    MetricsLog(tmp_path, tensorboard=False).row(_row(6))  # and one without it again
    with (tmp_path / "metrics.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["step"] for r in rows] == ["2", "4", "6"]
    assert [r["grad_norm"] for r in rows] == ["", "0.25", ""]
    assert list(rows[0])[-1] == "grad_norm"  # after the file's own columns
    MetricsLog(tmp_path, tensorboard=False).truncate_after(4)
    with (tmp_path / "metrics.csv").open(newline="") as handle:
        assert [r["step"] for r in csv.DictReader(handle)] == ["2", "4"]
