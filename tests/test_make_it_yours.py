"""The README's "Make it yours": each change is new files in a project made by
scripts/new_project.py, and no file of the template is edited.

The files come out of the generated project's README (blocks marked `<!-- tested: yours-... -->`,
each starting with a `# path` line), so the section and this test cannot drift apart. The project
runs from its own sources through PYTHONPATH: this venv has every dependency it needs.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from repro.core.data import synthetic

from conftest import ROOT, SHAPES, TINY, draw_shape

NAME = "my_lab"
# Two epochs of 6 steps with an evaluation at each end and a checkpoint every 4 steps.
RUN = [*TINY, "trainer.epochs=2", "trainer.checkpoint_every_steps=4", "dataloader.num_workers=0"]
INVARIANT = [*RUN, "trainer.global_batch=true", "trainer.world_invariant=true",
             "trainer.micro_batch=16", "trainer.num_threads=1", "seed=4"]  # fmt: skip
PENALTY = ["objective=logit_penalty", "objective.weight=0.05"]
CONFUSION = f"+callbacks.confusion._target_={NAME}.confusion.ConfusionLog"


def readme_files(readme: str) -> dict[str, str]:
    """Path -> text of every `yours-*` block of a README."""
    blocks = re.findall(r"<!-- tested: yours-[\w-]+ -->\n```\w*\n(.*?)```", readme, re.DOTALL)
    files = {}
    for text in blocks:
        path = re.match(r"# (\S+)\n", text)
        assert path, f"a tested block must start with its file's path:\n{text}"
        files[path.group(1)] = text
    return files


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("yours") / NAME
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "new_project.py"), NAME, "--dest", str(dest),
         "--own-engine"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    files = readme_files((dest / "README.md").read_text())
    assert {
        f"src/{NAME}/logit_penalty.py",
        "conf/objective/logit_penalty.yaml",
        f"src/{NAME}/confusion.py",
        f"src/{NAME}/numpy_files.py",
        "conf/data/numpy_files.yaml",
        f"src/{NAME}/top5.py",
        f"src/{NAME}/labelled_folder.py",
        "conf/data/labelled_folder.yaml",
        f"src/{NAME}/distillation.py",
        "conf/objective/distillation.yaml",
        f"src/{NAME}/early_stopping.py",
        f"src/{NAME}/grad_norms.py",
        f"src/{NAME}/mistakes.py",
    } <= set(files)
    for rel, text in files.items():
        assert not (dest / rel).exists(), f"{rel}: the README's file must be a new one"
        (dest / rel).write_text(text)
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=dest, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert status and all(line.startswith("?? ") for line in status), status  # nothing edited
    return dest


def run(project: Path, *args: str, module: str = "train", env: dict | None = None, nproc: int = 1):
    """`python -m NAME.<module> args` (under torchrun with `nproc` > 1) in the project."""
    launcher = [sys.executable]
    if nproc > 1:
        launcher += ["-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                     "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0"]  # fmt: skip
    full_env = {**os.environ, "PYTHONPATH": str(project / "src"), "PYTHONHASHSEED": "0"}
    return subprocess.run(
        [*launcher, "-m", f"{NAME}.{module}", *args],
        cwd=project, env={**full_env, **(env or {})}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def trained(project: Path, run_dir: Path, *args: str, nproc: int = 1) -> dict:
    done = run(project, *args, f"hydra.run.dir={run_dir}", nproc=nproc)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads((run_dir / "summary.json").read_text())


def rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.e2e
@pytest.mark.slow
def test_an_objective_term_is_a_column_a_metric_and_a_report_row(project, tmp_path):
    run_dir = tmp_path / "penalty"
    monitor = ["trainer.monitor=val_logit_penalty", "trainer.monitor_mode=min"]
    summary = trained(project, run_dir, *RUN, *PENALTY, *monitor)
    assert "weight: 0.05" in (run_dir / "resolved_config.yaml").read_text()
    table = rows(run_dir)
    for prefix in ("train", "val"):
        for term in ("logit_penalty", "cross_entropy"):
            assert all(float(row[f"{prefix}_{term}"]) > 0 for row in table)
    for row in table:  # the total is the sum its terms say, in training and in evaluation
        for prefix in ("train", "val"):
            total = float(row[f"{prefix}_cross_entropy"]) + 0.05 * float(
                row[f"{prefix}_logit_penalty"]
            )
            assert float(row[f"{prefix}_loss"]) == pytest.approx(total, rel=1e-5)
    assert summary["val_logit_penalty"] == float(table[-1]["val_logit_penalty"])
    penalties = {int(row["step"]): float(row["val_logit_penalty"]) for row in table}
    assert summary["best_val_logit_penalty"] == min(penalties.values())  # best.pt follows it
    assert penalties[summary["best_step"]] == summary["best_val_logit_penalty"]
    assert summary["test_logit_penalty"] > 0  # the test after training calls it too
    plain = trained(project, tmp_path / "plain", *RUN)
    assert plain["weights_sha256"] != summary["weights_sha256"]  # the penalty was trained on
    assert "val_logit_penalty" not in plain

    # The sweep report summarises the term without being told about it.
    sweep = tmp_path / "sweep"
    done = run(project, "-m", *RUN, *PENALTY, "seed=0,1", f"hydra.sweep.dir={sweep}")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((sweep / "sweep_summary.json").read_text())
    assert report["groups"]["all"]["val_logit_penalty"]["count"] == 2
    assert all(job["val_logit_penalty"] > 0 for job in report["jobs"])
    rebuilt = run(project, str(sweep), module="report")
    assert rebuilt.returncode == 0 and "val_logit_penalty" in rebuilt.stdout


@pytest.mark.e2e
@pytest.mark.slow
def test_a_metric_is_a_column_and_can_pick_the_best_checkpoint(project, tmp_path):
    top5 = [f"objective._target_={NAME}.top5.WithTop5", "trainer.monitor=val_top5"]
    summary = trained(project, tmp_path / "top5", *RUN, *top5)
    plain = trained(project, tmp_path / "plain", *RUN)
    assert summary["weights_sha256"] == plain["weights_sha256"]  # a metric is not trained on
    for row in rows(tmp_path / "top5"):
        assert float(row["val_acc"]) <= float(row["val_top5"]) <= 1
        assert 0 < float(row["train_top5"]) <= 1
    assert summary["best_val_top5"] == max(float(r["val_top5"]) for r in rows(tmp_path / "top5"))


@pytest.mark.e2e
@pytest.mark.slow
def test_an_objective_term_is_world_invariant(project, tmp_path):
    one = trained(project, tmp_path / "one", *INVARIANT, *PENALTY)
    two = trained(project, tmp_path / "two", *INVARIANT, *PENALTY, nproc=2)
    assert two["world_size"] == 2 and two["weights_sha256"] == one["weights_sha256"]
    assert two["val_logit_penalty"] == one["val_logit_penalty"]
    timing = ("images_per_s", "data_wait_frac", "train_s")  # the only columns that may differ

    def results(run_dir: Path) -> list[dict[str, str]]:
        return [{k: v for k, v in row.items() if k not in timing} for row in rows(run_dir)]

    assert results(tmp_path / "two") == results(tmp_path / "one")


@pytest.mark.e2e
@pytest.mark.slow
def test_a_callback_with_state_writes_the_same_files_after_a_kill_and_resume(project, tmp_path):
    straight = trained(project, tmp_path / "straight", *RUN, CONFUSION)
    matrices = json.loads((tmp_path / "straight" / "confusion.json").read_text())
    assert sorted(matrices, key=int) == ["6", "12"]  # one matrix per evaluation
    val_images = 128  # TINY's data.val_size
    for step, matrix in matrices.items():
        assert sum(map(sum, matrix)) == val_images
        row = next(r for r in rows(tmp_path / "straight") if r["step"] == step)
        correct = sum(matrix[i][i] for i in range(len(matrix)))
        assert correct / val_images == float(row["val_acc"])

    killed = tmp_path / "killed"
    args = [*RUN, CONFUSION, f"hydra.run.dir={killed}"]
    done = run(project, *args, env={f"{NAME.upper()}_FAULT": "step:10"})
    assert done.returncode == -9, done.stderr[
        -2000:
    ]  # after step 6's evaluation, step 8's checkpoint
    resumed = trained(project, killed, *RUN, CONFUSION)
    assert resumed["weights_sha256"] == straight["weights_sha256"]
    assert (killed / "confusion.json").read_bytes() == (
        tmp_path / "straight" / "confusion.json"
    ).read_bytes()


@pytest.mark.e2e
@pytest.mark.slow
def test_the_mistakes_callback_writes_each_classs_wrong_images_and_is_refused_for_multi_label(
    project, tmp_path
):
    from torchvision.io import read_image

    mistakes = f"+callbacks.mistakes._target_={NAME}.mistakes.Mistakes"
    run_dir = tmp_path / "run"
    trained(project, run_dir, *TINY, "trainer.max_steps=3", mistakes, CONFUSION)
    matrix = json.loads((run_dir / "confusion.json").read_text())["3"]
    names = list(synthetic.CLASSES)  # the default data's classes, in label order
    wrong = {names[i]: sum(row) - row[i] for i, row in enumerate(matrix)}
    expected = {name: min(8, count) for name, count in wrong.items() if count}
    assert expected, "a model after 3 steps gets some validation images wrong"
    strips = {
        path.name.removeprefix("000003-").removesuffix(".png"): read_image(str(path))
        for path in (run_dir / "mistakes").glob("*.png")
    }
    # One strip per class with mistakes: up to 8 images of 32 pixels, a pixel of padding around
    # each (make_grid returns a lone image as it is).
    assert {name: (strip.shape[-1] + 1) // 33 for name, strip in strips.items()} == expected
    refused = run(
        project,
        *TINY,
        mistakes,
        "objective=multilabel_bce",
        "data=synthetic_multilabel",
        f"hydra.run.dir={tmp_path / 'multi'}",
    )
    assert refused.returncode == 2
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .endswith("a multi-label objective has no single class per image to score")
    )


@pytest.fixture(scope="module")
def arrays(tmp_path_factory) -> Path:
    """NumPy files as the README's dataset reads them: 480 train and 96 test images."""
    root = tmp_path_factory.mktemp("arrays")
    for name, count, seed in (("train", 480, 5), ("test", 96, 6)):
        images, labels = synthetic.generate(count, seed, 10)
        np.save(root / f"{name}_images.npy", images.permute(0, 2, 3, 1).numpy())
        np.save(root / f"{name}_labels.npy", labels.numpy())
    return root


@pytest.mark.e2e
@pytest.mark.slow
def test_a_numpy_dataset_trains_exactly_with_workers_and_after_a_kill(project, arrays, tmp_path):
    data = ["data=numpy_files", f"data.root={arrays}", "data.val_size=96"]
    args = [*RUN, *data]
    straight = trained(project, tmp_path / "straight", *args)
    assert straight["data"]["splits"]["train"]["images"] == 384  # 480 less the 96 held out
    assert straight["completed"] and straight["total_steps"] == 12
    workers = trained(project, tmp_path / "workers", *args, "dataloader.num_workers=2")
    assert workers["weights_sha256"] == straight["weights_sha256"]

    killed = tmp_path / "killed"
    fault = {f"{NAME.upper()}_FAULT": "step:10"}
    done = run(project, *args, f"hydra.run.dir={killed}", env=fault)
    assert done.returncode == -9, done.stderr[-2000:]
    assert trained(project, killed, *args)["weights_sha256"] == straight["weights_sha256"]


TIMING = ("images_per_s", "data_wait_frac", "train_s")  # the only columns that may differ


def results(run_dir: Path) -> list[dict[str, str]]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows(run_dir)]


def killed_and_resumed(project: Path, run_dir: Path, step: int, *args: str) -> dict:
    """The run SIGKILLed after `step`, then the same command again."""
    done = run(
        project, *args, f"hydra.run.dir={run_dir}", env={f"{NAME.upper()}_FAULT": f"step:{step}"}
    )
    assert done.returncode == -9, done.stderr[-2000:]
    return trained(project, run_dir, *args)


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> Path:
    """A flat folder of PNGs of the three shapes, and two CSVs naming their class and split:
    labels.csv (150 train, 30 test) and fold2.csv (the first 150 of its rows)."""
    import random

    root = tmp_path_factory.mktemp("labelled")
    rng = np.random.default_rng(0)
    rows_out = []
    for i in range(180):
        kind = SHAPES[i % 3]
        draw_shape(kind, 32, 32, rng).save(root / f"{i:03d}.png")
        rows_out.append((f"{i:03d}.png", kind, "test" if i >= 150 else "train"))
    random.Random(0).shuffle(rows_out)  # a CSV's order is its own
    for name, chosen in (("labels.csv", rows_out), ("fold2.csv", rows_out[:150])):
        with (root / name).open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["file", "label", "split"])
            writer.writerows(chosen)
    return root


@pytest.mark.e2e
@pytest.mark.slow
def test_a_dataset_with_its_own_setting_trains_exactly_and_refuses_a_mistyped_one(
    project, labelled, tmp_path
):
    last = "trainer.test_weights=last"  # 16 validation images: too few to select by
    args = [*RUN, "data=labelled_folder", f"data.root={labelled}", "data.val_size=16", last]
    straight = trained(project, tmp_path / "straight", *args)
    assert straight["data"]["splits"]["train"]["images"] == 134  # 150 less the 16 held out
    assert "labels_file: labels.csv" in (tmp_path / "straight" / "resolved_config.yaml").read_text()
    workers = trained(project, tmp_path / "workers", *args, "dataloader.num_workers=2")
    assert workers["weights_sha256"] == straight["weights_sha256"]
    fold = trained(project, tmp_path / "fold", *args, "data.labels_file=fold2.csv")
    assert 64 < fold["data"]["splits"]["train"]["images"] < 134
    # A resume with another value of the setting is another run's data: refused.
    done = run(
        project, *args, "data.labels_file=fold2.csv", f"hydra.run.dir={tmp_path / 'straight'}"
    )
    assert done.returncode != 0 and "labels_file" in done.stderr

    typo = tmp_path / "typo"
    done = run(project, *args, "+data.labels_fil=fold2.csv", f"hydra.run.dir={typo}")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "did you mean data.labels_file?" in lines[0], done.stderr
    assert not (typo / "checkpoints").exists()  # refused before any work


@pytest.mark.e2e
@pytest.mark.slow
def test_distillation_from_a_teacher_run_with_tta_and_accumulation(project, tmp_path):
    teacher = tmp_path / "teacher"
    trained(project, teacher, *RUN)
    distil = ["objective=distillation", f"+components.teacher._target_={NAME}.distillation.Teacher",
              f"+components.teacher.checkpoint={teacher}"]  # fmt: skip
    student = trained(project, tmp_path / "student", *RUN, *distil)
    plain = trained(project, tmp_path / "plain", *RUN)
    assert student["weights_sha256"] != plain["weights_sha256"]  # the teacher was heard
    for row in rows(tmp_path / "student"):
        assert float(row["train_distill"]) > 0
        assert row["val_loss"] == row["val_cross_entropy"]  # evaluation scores the student
    assert "val_distill" not in rows(tmp_path / "student")[0]
    # Two forwards per image (flip TTA) and two micro-batches per step: nothing breaks, and
    # the accumulated step trains on what the whole batch would give.
    both = trained(project, tmp_path / "both", *RUN, *distil, "trainer.tta=flip",
                   "trainer.accumulate_steps=2")  # fmt: skip
    assert both["completed"] and both["test_loss"] > 0

    missing = run(project, *RUN, "objective=distillation", f"hydra.run.dir={tmp_path / 'alone'}")
    lines = missing.stderr.strip().splitlines()
    assert missing.returncode == 2 and len(lines) == 1, missing.stderr
    assert "add +components.teacher._target_=" in lines[0]


@pytest.mark.e2e
@pytest.mark.slow
def test_early_stopping_on_any_metric_stops_at_the_same_step_after_a_kill(project, tmp_path):
    stopping = [*RUN, "trainer.eval_every_steps=2",
                f"+callbacks.stop._target_={NAME}.early_stopping.EarlyStopping",
                "+callbacks.stop.metric=val_loss", "+callbacks.stop.patience=2",
                "+callbacks.stop.min_delta=10"]  # fmt: skip
    # Evaluations at 2 (the best), 4 and 6 (not better by 10): stopped at step 6 of 12.
    straight = trained(project, tmp_path / "straight", *stopping)
    assert straight["step"] == 6 and straight["completed"] and straight["stopped_early"]
    assert straight["stop_reason"] == "val_loss not better by 10 for 2 evaluations"
    attempts = (tmp_path / "straight" / "attempts.jsonl").read_text().splitlines()
    assert json.loads(attempts[-1])["result"].startswith("completed, stopped early: val_loss")
    # Killed after step 5 (the checkpoint of step 4 holds one stale evaluation): resumed, it
    # stops at step 6 all the same, with the same weights and rows.
    resumed = killed_and_resumed(project, tmp_path / "killed", 5, *stopping)
    assert resumed["step"] == 6 and resumed["stop_reason"] == straight["stop_reason"]
    assert resumed["weights_sha256"] == straight["weights_sha256"]
    assert results(tmp_path / "killed") == results(tmp_path / "straight")


@pytest.mark.e2e
@pytest.mark.slow
def test_a_gradient_norm_column_resumes_exactly_and_can_join_a_resumed_run(project, tmp_path):
    norms = [*RUN, f"+callbacks.grad_norms._target_={NAME}.grad_norms.GradNorms"]
    straight = trained(project, tmp_path / "straight", *norms)
    assert all(float(row["grad_norm"]) > 0 for row in rows(tmp_path / "straight"))
    resumed = killed_and_resumed(project, tmp_path / "killed", 10, *norms)
    assert resumed["weights_sha256"] == straight["weights_sha256"]
    assert results(tmp_path / "killed") == results(tmp_path / "straight")
    # Added on a resume: the column starts there.
    late = tmp_path / "late"
    trained(project, late, *RUN, "trainer.halt_at_step=6")
    trained(project, late, *norms)
    assert rows(late)[0]["grad_norm"] == ""
    assert rows(late)[1]["grad_norm"] == rows(tmp_path / "straight")[1]["grad_norm"]
