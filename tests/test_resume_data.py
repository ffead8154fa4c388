"""Resuming on every kind of data: what the data implies (an image folder's class count) is no
config difference, and data that changed under a run folder is refused, naming it."""

from __future__ import annotations

import random
import shutil
import signal

import pytest

from repro.core.errors import CheckpointError

from conftest import (
    IMAGEFOLDER,
    draw_shape,
    make_image_tree,
    read_summary,
    run_cli,
    tiny,
    train_in_process,
)

# 3 classes x 12 images, batches of 12: 3 steps an epoch, 12 in all; a checkpoint every 2.
FOLDER = [
    *IMAGEFOLDER,
    "trainer.checkpoint_every_steps=2",
    "trainer.keep_checkpoints=3",
    "trainer.test_weights=last",  # the trees' few validation images: too few to select by
]

# Every way a run reads its data, each with the step it is halted at.
DATA_OPTIONS = {
    "synthetic": (tiny("trainer.epochs=2", "trainer.checkpoint_every_steps=4"), 7),
    "imagefolder": (FOLDER, 10),
    "imagefolder, val carved from train": (FOLDER, 5),
    "imagefolder, data.cache=memory": ([*FOLDER, "data.cache=memory"], 5),
    "imagefolder, data.fraction=0.5": ([*FOLDER, "data.fraction=0.5"], 3),
    "imagefolder, dataloader=device": ([*FOLDER, "data.cache=memory", "dataloader=device"], 7),
}

# The others run in make test-all; synthetic data's halted run is test_train_units' too.
FAST_OPTIONS = ("imagefolder",)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return make_image_tree(tmp_path_factory.mktemp("data") / "images")


@pytest.fixture(scope="module")
def carved_tree(tmp_path_factory):
    root = make_image_tree(tmp_path_factory.mktemp("data") / "images")
    shutil.rmtree(root / "val")  # data.val_size images of train/ are held out instead
    return root


def _overrides(option: str, tree, carved_tree) -> list[str]:
    overrides, _ = DATA_OPTIONS[option]
    if option == "synthetic":
        return overrides
    root = carved_tree if "carved" in option else tree
    extra = ["data.val_size=9"] if "carved" in option else []
    return [*overrides, f"data.root={root}", *extra]


@pytest.mark.parametrize(
    "option",
    [pytest.param(o, marks=[] if o in FAST_OPTIONS else [pytest.mark.slow]) for o in DATA_OPTIONS],
)
def test_a_halted_run_resumes_to_the_straight_weights(option, tree, carved_tree, tmp_path):
    overrides = _overrides(option, tree, carved_tree)
    straight = train_in_process(tmp_path / "straight", *overrides)
    halt_at = DATA_OPTIONS[option][1]
    halted = train_in_process(tmp_path / "run", *overrides, f"trainer.halt_at_step={halt_at}")
    assert halted["step"] == halt_at and not halted["completed"]
    resumed = train_in_process(tmp_path / "run", *overrides)  # the same command again
    assert resumed["resumed_from_step"] == halt_at
    assert resumed["weights_sha256"] == straight["weights_sha256"]


def test_an_inferred_class_count_is_recorded_but_stays_out_of_the_config(tree, tmp_path):
    summary = train_in_process(tmp_path / "run", *FOLDER, f"data.root={tree}", "trainer.epochs=1")
    resolved = (tmp_path / "run" / "resolved_config.yaml").read_text()
    assert "num_classes: null" in resolved  # what the user asked for: infer it
    assert summary["data"]["classes"] == 3  # what the data implied


@pytest.mark.slow  # older checkpoints; the halted-run resumes above stay in make test
def test_a_checkpoint_that_stored_the_inferred_count_still_resumes(tree, tmp_path):
    """Checkpoints written before the fix hold data.num_classes=3 in their config."""
    from repro.core.runs import checkpoint

    overrides = [*FOLDER, f"data.root={tree}"]
    straight = train_in_process(tmp_path / "straight", *overrides)
    train_in_process(tmp_path / "run", *overrides, "trainer.halt_at_step=6")
    folder = tmp_path / "run" / "checkpoints"
    for path in folder.glob("step-*.pt"):
        state = checkpoint.load(path)
        state["config"]["data"]["num_classes"] = state["config"]["model"]["num_classes"] = 3
        del state["split_sizes"]  # nor did they record the split sizes
        path.unlink()  # last.pt is a hard link to the newest: write both anew
        checkpoint.atomic_save(state, path)
    (folder / "last.pt").unlink()
    resumed = train_in_process(tmp_path / "run", *overrides)
    assert resumed["resumed_from_step"] == 6
    assert resumed["weights_sha256"] == straight["weights_sha256"]


def _add_class(root, name: str) -> None:
    rng = __import__("numpy").random.default_rng(1)
    for split in ("train", "val"):
        folder = root / split / name
        folder.mkdir()
        for index in range(12):
            draw_shape("circle", 40, 40, rng).save(folder / f"{index}.png")


def test_a_resume_after_the_folder_gained_a_class_is_refused_naming_the_data(tmp_path):
    root = make_image_tree(tmp_path / "images")
    overrides = [*FOLDER, f"data.root={root}"]
    train_in_process(tmp_path / "run", *overrides, "trainer.halt_at_step=4")
    _add_class(root, "ring")
    with pytest.raises(CheckpointError, match=r"data\.root=.*images.*ring.*trained on"):
        train_in_process(tmp_path / "run", *overrides)


def test_a_resume_after_the_folder_lost_images_is_refused_naming_the_split(tmp_path):
    root = make_image_tree(tmp_path / "images")
    overrides = [*FOLDER, f"data.root={root}"]
    train_in_process(tmp_path / "run", *overrides, "trainer.halt_at_step=4")
    (root / "val" / "bar" / "0.png").unlink()
    with pytest.raises(
        CheckpointError, match=r"data\.root=.*images: .*\(val 36 -> 35, test 36 -> 35 images\)"
    ):
        train_in_process(tmp_path / "run", *overrides)


@pytest.fixture(scope="module")
def square_tree(tmp_path_factory):
    """Images of one size: a cached run gives the uncached run's weights (see the README)."""
    return make_image_tree(tmp_path_factory.mktemp("data") / "images", side=40)


@pytest.fixture(scope="module")
def straight_hash(square_tree, tmp_path_factory):
    """The uninterrupted run's weights: the same for any number of workers, cached or not."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    root = f"data.root={square_tree}"
    done = run_cli("repro.train", *FOLDER, root, f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr
    return read_summary(run_dir)["weights_sha256"]


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("workers", "cache"), [(0, "none"), (2, "none"), (2, "memory")], ids=["w0", "w2", "w2-memory"]
)
@pytest.mark.slow
def test_an_image_folder_run_killed_at_a_random_step_resumes_exactly(
    workers, cache, square_tree, straight_hash, tmp_path
):
    kill_at = random.Random(f"{workers}{cache}").randrange(3, 12)  # after the first checkpoint
    run_dir = tmp_path / "run"
    command = [
        *FOLDER, f"data.root={square_tree}", f"data.cache={cache}", "dataloader=default",
        f"dataloader.num_workers={workers}", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    killed = run_cli("repro.train", *command, env={"REPRO_FAULT": f"step:{kill_at}"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = run_cli("repro.train", *command)
    assert resumed.returncode == 0, resumed.stderr
    summary = read_summary(run_dir)
    assert 2 <= summary["resumed_from_step"] <= kill_at
    assert summary["weights_sha256"] == straight_hash
