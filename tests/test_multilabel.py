"""Multi-label and soft-label runs keep every exactness promise: the same weights for 0 and 2
workers, after a SIGKILL and a rerun, and (world-invariant) on 1 and 2 processes; and the
checkpoint commands work on a multi-label run folder."""

from __future__ import annotations

import csv
import json
import os
import signal
import zipfile
from pathlib import Path

import pytest
import torch

from repro.extras.multilabel.synthetic import generate

from conftest import ROOT, make_image_tree, read_summary, run_cli, tiny, torchrun, train_in_process

TESTS = str(ROOT / "tests")
MULTI = ("objective=multilabel_bce", "data=synthetic_multilabel")
SOFT = ("data._target_=soft_data.soft_synthetic",)
KINDS = {"multi-label": MULTI, "soft labels": SOFT}
# 6 steps an epoch, 2 epochs, a checkpoint every 4 steps.
RESUMABLE = tiny("trainer.epochs=2", "trainer.checkpoint_every_steps=4")


def test_the_multi_label_shapes_are_a_grid_of_four_with_their_classes_as_targets():
    images, targets = generate(5, seed=3, classes=10)
    again, same = generate(5, seed=3, classes=10)
    assert torch.equal(images, again) and torch.equal(targets, same)
    assert images.shape == (5, 3, 32, 32) and images.dtype == torch.uint8
    assert targets.dtype == torch.float32 and set(targets.unique().tolist()) == {0.0, 1.0}
    assert ((targets.sum(1) >= 1) & (targets.sum(1) <= 4)).all()


@pytest.mark.parametrize("kind", KINDS)
def test_two_workers_give_the_weights_of_none(kind, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(TESTS)
    hashes = [
        train_in_process(tmp_path / f"w{w}", *tiny(*KINDS[kind], f"dataloader.num_workers={w}"))[
            "weights_sha256"
        ]
        for w in (0, 2)
    ]
    assert hashes[0] == hashes[1]


def test_a_multi_label_run_logs_and_monitors_map_and_its_labels(tmp_path):
    summary = train_in_process(tmp_path, *tiny(*MULTI))
    assert 0 < summary["val_map"] <= 1 and 0 < summary["test_map"] <= 1
    assert "best_val_map" in summary and summary["best_step"] == summary["step"]
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"val_map", "val_ap_disk", "val_f1_moon", "val_acc"} <= set(header)
    assert "val_top5" not in header


def trained(run_dir: Path, *args: str, processes: int = 1) -> dict:
    """A run as a command (under torchrun with 2 processes), tests/ on the path for soft_data;
    its summary."""
    where, env = f"hydra.run.dir={run_dir}", {"PYTHONPATH": TESTS}
    done = (
        torchrun(*args, where, env=env)
        if processes == 2
        else run_cli("repro.train", *args, where, env=env)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return read_summary(run_dir)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_killed_run_reruns_to_the_straight_weights(kind, tmp_path):
    straight = trained(tmp_path / "s", *RESUMABLE, *KINDS[kind])
    command = [*RESUMABLE, *KINDS[kind], "dataloader.num_workers=2"]
    killed = run_cli(
        "repro.train",
        *command,
        f"hydra.run.dir={tmp_path / 'k'}",
        env={"PYTHONPATH": TESTS, "REPRO_FAULT": "step:7"},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    summary = trained(tmp_path / "k", *command)
    assert summary["resumed_from_step"] == 6
    assert summary["weights_sha256"] == straight["weights_sha256"]


INVARIANT = tiny(
    "trainer.epochs=1",
    "trainer.global_batch=true",
    "trainer.world_invariant=true",
    "trainer.micro_batch=16",
    "trainer.num_threads=1",
    "dataloader.num_workers=0",
)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_world_invariant_runs_give_the_same_weights_on_one_and_two_processes(kind, tmp_path):
    first = trained(tmp_path / "1", *INVARIANT, *KINDS[kind])
    second = trained(tmp_path / "2", *INVARIANT, *KINDS[kind], processes=2)
    assert second["world_size"] == 2
    assert first["weights_sha256"] == second["weights_sha256"]
    for key in ("val_loss", "val_acc", *(("val_map",) if kind == "multi-label" else ())):
        assert first[key] == second[key], key


@pytest.fixture(scope="module")
def multi_label_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("multi") / "run"
    done = run_cli("repro.train", *tiny(*MULTI), f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def grid_images(tmp_path_factory) -> Path:
    from torchvision.io import write_png

    folder = tmp_path_factory.mktemp("grids")
    images, _ = generate(3, seed=11, classes=10)
    for index, image in enumerate(images):
        write_png(image, str(folder / f"{index}.png"))
    return folder


@pytest.mark.e2e
@pytest.mark.slow
def test_evaluate_predict_and_export_work_on_a_multi_label_run(
    multi_label_run, grid_images, tmp_path
):
    summary = read_summary(multi_label_run)
    out = tmp_path / "result.json"
    done = run_cli("repro.evaluate", f"ckpt={multi_label_run}", "per_class=true", f"out={out}")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["map"] == summary["test_map"] and result["acc"] == summary["test_acc"]
    assert [row["label"] for row in result["per_label"]][:2] == ["disk", "square"]
    assert result["per_label"][0]["ap"] == summary["test_ap_disk"]
    assert "confusion" not in result
    assert f"map {summary['test_map']:.4f}" in done.stdout

    table = tmp_path / "predictions.csv"
    done = run_cli(
        "repro.predict", f"ckpt={multi_label_run}", f"images={grid_images}", f"out={table}"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader(table.open()))
    assert len(rows) == 3 and list(rows[0])[:3] == ["path", "labels", "p_disk"]
    for row in rows:
        above = [name for name in row if name.startswith("p_") and float(row[name]) > 0.5]
        said = row["labels"].split(";") if row["labels"] else []
        assert said == [name.removeprefix("p_") for name in above]
        assert all(0 <= float(row[name]) <= 1 for name in row if name.startswith("p_"))

    done = run_cli(
        "repro.export",
        f"ckpt={multi_label_run}",
        "format=torchscript",
        f"out={tmp_path / 'model.pt'}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "model.pt").exists() and (tmp_path / "model.pt.json").exists()


def test_image_files_with_multi_hot_rows_from_a_csv_train_alike_with_workers_and_a_cache(
    tmp_path,
):
    """The per-sample path (files decoded one by one) and the decoded cache carry
    multi-hot rows as the in-memory path does: the same weights for 0 and 2 workers."""
    tree = make_image_tree(tmp_path / "tree", 8, side=40)  # one size: the cache is exact
    rows = ["path,circle,square,animal"]
    for path in sorted((tree / "train").rglob("*.png")):
        shape = path.parent.name
        rows.append(f"{path.relative_to(tree)},{int(shape == 'circle')},{int(shape == 'square')},1")
    (tree / "train.csv").write_text("\n".join(rows) + "\n")
    test_rows = [rows[0]] + [
        f"{path.relative_to(tree)},{int(path.parent.name == 'circle')},"
        f"{int(path.parent.name == 'square')},1"
        for path in sorted((tree / "val").rglob("*.png"))
    ]
    (tree / "test.csv").write_text("\n".join(test_rows) + "\n")
    args = [
        *MULTI[:1],
        "data=csv_labels",
        "data.test_file=test.csv",
        f"data.root={tree}",
        "data.val_size=0",
        "trainer.test_weights=last",
        "trainer.batch_size=6",
        "trainer.epochs=1",
        "model.widths=[8,16]",
        "logger.plot=false",
        "data.resize=36",
    ]
    runs = {
        name: train_in_process(tmp_path / name, *args, *extra)
        for name, extra in {
            "none": ["dataloader.num_workers=0"],
            "two": ["dataloader.num_workers=2"],
            "cached": ["dataloader.num_workers=0", "data.cache=memory"],
        }.items()
    }
    assert runs["none"]["weights_sha256"] == runs["two"]["weights_sha256"]
    assert runs["none"]["weights_sha256"] == runs["cached"]["weights_sha256"]
    assert runs["none"]["data"]["splits"]["train"]["images"] == 24
    assert {"test_ap_circle", "test_f1_animal", "test_map"} <= set(runs["none"])
    # Without a test file the empty validation split would stand in: nothing is tested.
    untested = train_in_process(tmp_path / "untested", *args, "data.test_file=null")
    assert untested["completed"] and "test_acc" not in untested


def test_training_on_every_image_evaluates_nothing_between_epochs_and_tests_the_last(tmp_path):
    summary = train_in_process(tmp_path, *tiny("data.val_size=0", "trainer.test_weights=last"))
    assert summary["test_weights"] == "last" and "val_acc" not in summary
    assert summary["best_step"] is None
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    assert not [column for column in header if column.startswith("val_")]
    assert not (tmp_path / "checkpoints" / "best.pt").exists()
    resolved = (tmp_path / "resolved_config.yaml").read_text()
    assert "val_size: 0" in resolved


@pytest.mark.e2e
@pytest.mark.slow
def test_a_run_on_every_image_resumes_exactly(tmp_path):
    command = [*RESUMABLE, "data.val_size=0", "trainer.test_weights=last"]
    straight = run_cli("repro.train", *command, f"hydra.run.dir={tmp_path / 's'}")
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = run_cli(
        "repro.train", *command, f"hydra.run.dir={tmp_path / 'k'}", env={"REPRO_FAULT": "step:9"}
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = run_cli("repro.train", *command, f"hydra.run.dir={tmp_path / 'k'}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    first, second = read_summary(tmp_path / "s"), read_summary(tmp_path / "k")
    assert second["resumed_from_step"] == 8
    assert first["weights_sha256"] == second["weights_sha256"]
    assert first["test_acc"] == second["test_acc"]


# A zip of CIFAR-10 as JPEGs (train/<class>/*.jpg, test/<class>/*.jpg), as test_imagefolder's.
CIFAR_JPEG = Path(
    os.environ.get("REPRO_CIFAR10_JPEG") or ROOT.parent / "shared" / "data" / "cifar10-jpeg.zip"
)
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
GROUPS = {
    "animal": {"bird", "cat", "deer", "dog", "frog", "horse"},
    "vehicle": {"airplane", "automobile", "ship", "truck"},
    "has_wings": {"airplane", "bird"},
}


def write_13_column_csv(root: Path, per_class: dict[str, int]) -> None:
    """`per_class[split]` JPEGs of each class out of the archive, and `<split>.csv` listing
    them with the 10 classes and the three groups as 13 labels."""
    header = ["path", *CLASSES, *GROUPS]
    with zipfile.ZipFile(CIFAR_JPEG) as archive:
        names = sorted(n for n in archive.namelist() if n.endswith(".jpg"))
        for split, limit in per_class.items():
            rows, counts = [], dict.fromkeys(CLASSES, 0)
            for name in names:
                where, cls = name.split("/")[-3:-1]
                if where != split or counts[cls] >= limit:
                    continue
                counts[cls] += 1
                path = Path(split) / cls / Path(name).name
                (root / path).parent.mkdir(parents=True, exist_ok=True)
                (root / path).write_bytes(archive.read(name))
                labels = [int(cls == c) for c in CLASSES] + [int(cls in g) for g in GROUPS.values()]
                rows.append([str(path), *labels])
            with (root / f"{split}.csv").open("w", newline="") as handle:
                csv.writer(handle).writerows([header, *rows])


@pytest.mark.slow
@pytest.mark.skipif(not CIFAR_JPEG.exists(), reason=f"{CIFAR_JPEG} is absent")
def test_cifar10_jpegs_with_13_labels_train_from_a_csv_and_the_built_in_metrics(tmp_path):
    root = tmp_path / "cifar13"
    write_13_column_csv(root, {"train": 200, "test": 50})
    summary = train_in_process(
        tmp_path / "run",
        "objective=multilabel_bce",
        "data=csv_labels",
        f"data.root={root}",
        "data.test_file=test.csv",
        "data.val_size=400",
        "trainer.epochs=3",
        "trainer.batch_size=100",
        "dataloader.num_workers=2",
        "logger.plot=false",
    )
    # By chance, average precision is each label's share: 0.1 for the classes, 0.6, 0.4, 0.2.
    assert summary["val_map"] > 0.3 and summary["test_map"] > 0.3
    assert {"val_ap_has_wings", "val_f1_vehicle", "test_ap_animal"} <= set(summary)
