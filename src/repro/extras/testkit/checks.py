"""The kit's checks, as pytest tests: a project's test module imports them (`from
repro.extras.testkit.checks import *`) and the plugin (repro.extras.testkit.plugin) runs each once per
option of the project's conf/ that it concerns, so that an option added there is checked
without a test of its own. Each option runs with the experiment meant for it (the first of
conf/experiment/ that chooses it: a multi-label dataset with its objective), else with the
project's defaults. A failure is a few lines: the option, the promise it broke and what to
change (pytest -v adds the traceback).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from repro.core.data.sources import target_text
from repro.core.errors import UserError
from repro.core.runs.fingerprint_log import first_divergence
from repro.extras.testkit.project import Project
from repro.extras.testkit.runs import KILL_AFTER_STEP, RunFailedError, result_files, steps

__all__ = [
    "test_data_gives_the_same_item_every_time_an_index_is_read",
    "test_data_gives_the_same_split_for_the_same_seed",
    "test_data_trains_the_same_steps_with_0_and_2_workers",
    "test_experiment_runs_what_it_says_and_survives_a_kill",
    "test_metric_gives_the_same_value_for_0_and_2_workers_and_1_and_2_processes",
    "test_objective_gives_the_same_steps_on_1_and_2_processes",
    "test_objective_resumes_bit_for_bit_after_a_kill",
    "test_objective_trains_as_the_trainer_calls_it",
    "test_stateful_part_resumes_bit_for_bit_after_a_kill",
    "test_the_default_config_survives_a_kill",
]
SEED = 7
ITEM_RULE = (
    "a dataset must give the same item for the same index on every call and in every process: "
    "no draws from torch's, numpy's or Python's global generators in __getitem__ and no state "
    "that changes with calls (draw once in the builder, or from a generator seeded by the index)"
)
STATE_RULE = (
    "a part that keeps anything between calls (a count, a running value, a file it appends to) "
    "saves all of it in state_dict() and restores it in load_state_dict()"
)
INVARIANT = (
    "trainer.world_invariant=true",
    "trainer.global_batch=true",
    "trainer.micro_batch=16",
    "trainer.num_threads=1",
    "dataloader.num_workers=0",
)
PAIRING = (
    "if it is meant for other data or another objective, an experiment in conf/experiment/ "
    "that chooses both pairs them, and the kit checks them together"
)


@contextmanager
def promise(what: str, paired: bool = True) -> Iterator[None]:
    """A run's error as a few lines naming `what` (the option and its promise)."""
    try:
        yield
    except RunFailedError as failed:
        hint = "" if paired else f"; {PAIRING}"
        raise AssertionError(f"{what}: the run failed: {failed.line}{hint}") from failed
    except UserError as error:  # a config the engine refuses, in its own words
        raise AssertionError(f"{what}: {error}") from error


def _same_steps(first: Path, second: Path, names: tuple[str, str]) -> str | None:
    """Where two runs part: the first step that differs, or a missing step; None if alike."""
    rows = steps(first), steps(second)
    parted = first_divergence(*rows, names)
    if parted is None and len(rows[0]) != len(rows[1]):
        return f"step {min(map(len, rows)) + 1}: recorded {names[0]} only, or {names[1]} only"
    return parted


def _item(source: Any, index: int) -> tuple[tuple[int, ...], bytes, str]:
    image, label = source[index]
    image = torch.as_tensor(image)
    return tuple(image.shape), image.contiguous().numpy().tobytes(), target_text(label)


def test_data_gives_the_same_split_for_the_same_seed(repro_project: Project, data_option: str):
    """The split's items, not only its size: a digest of every image and label of each split
    (repro.core.data.fingerprint, what a run records), built twice from the same seed."""
    from repro.core import build
    from repro.core.data.fingerprint import fingerprint

    cfg = repro_project.config(f"data={data_option}")
    with promise(f"data={data_option}: building its splits"):
        first, again = (
            fingerprint(build.splits(cfg, SEED), cfg.data.get("root"))["splits"] for _ in range(2)
        )
    differ = [split for split in first if first[split] != again[split]]
    assert not differ, (
        f"data={data_option}: built twice from seed {SEED}, the {' and '.join(differ)} split(s) "
        "held other items: the builder must make the same split for the same seed"
    )


def test_data_gives_the_same_item_every_time_an_index_is_read(
    repro_project: Project, data_option: str
):
    """Each split's first, middle and last items read twice, straight from the source. A
    training comparison alone can miss a draw in __getitem__: the engine seeds torch's global
    generator per sample (for third-party transforms), which can make such a dataset train
    alike with 0 and 2 workers while it breaks the promise anywhere else it is read."""
    from repro.core import build

    with promise(f"data={data_option}: building its splits"):
        data = build.splits(repro_project.config(f"data={data_option}"), SEED)
    for split in ("train", "val", "test"):
        source = getattr(data, split)
        for index in sorted({0, len(source) // 2, len(source) - 1} if len(source) else ()):
            first, again = _item(source, index), _item(source, index)
            names = ("shape", "pixels", "label")
            what = next(
                (name for name, a, b in zip(names, first, again, strict=True) if a != b), None
            )
            assert what is None, (
                f"data={data_option}: {split} item {index} read twice gave other {what}: "
                f"{ITEM_RULE}"
            )


def test_data_trains_the_same_steps_with_0_and_2_workers(repro_project: Project, data_option: str):
    """A tiny run with 0 and with 2 loader workers: the same loss and weights at every step."""
    paired = repro_project.meant_for("data", data_option)
    runs = {}
    for workers in (0, 2):
        cfg = repro_project.config(
            *paired, f"data={data_option}", f"dataloader.num_workers={workers}"
        )
        with promise(f"data={data_option}: training with {workers} loader workers", bool(paired)):
            runs[workers] = repro_project.runs.straight(cfg)
    parted = _same_steps(runs[0], runs[2], ("with 0 workers", "with 2"))
    assert parted is None, (
        f"data={data_option}: 0 and 2 loader workers trained differently, first at {parted}; "
        f"{ITEM_RULE}"
    )


def test_objective_trains_as_the_trainer_calls_it(repro_project: Project, objective_option: str):
    """A tiny run: the trainer calls the objective on each micro-batch with gradients on and
    `Batch.training` true, and in evaluation under no_grad with it false; the loop checks each
    term's shape (per image or per batch, repro.core.tasks.objectives.check_terms) and the loss."""
    paired = repro_project.meant_for("objective", objective_option)
    cfg = repro_project.config(*paired, f"objective={objective_option}")
    with promise(f"objective={objective_option}: training with it", bool(paired)):
        run = repro_project.runs.straight(cfg)
    losses = [float(row[1]) for row in steps(run)]
    assert losses and all(torch.isfinite(torch.tensor(losses))), (
        f"objective={objective_option}: losses {losses}: every step's loss must be finite"
    )


def test_objective_gives_the_same_steps_on_1_and_2_processes(
    repro_project: Project, objective_option: str
):
    """`trainer.world_invariant=true` on one process and on two (gloo, CPU): the same loss and
    weights at every step. Per-image terms and batch means of them combine across processes as
    across micro-batches; a term that depends on how the batch is cut, or on earlier calls,
    does not."""
    paired = repro_project.meant_for("objective", objective_option)
    cfg = repro_project.config(*paired, f"objective={objective_option}", *INVARIANT)
    with promise(f"objective={objective_option}: training on 1 and 2 processes", bool(paired)):
        one, two = repro_project.runs.straight(cfg), repro_project.runs.on_two_processes(cfg)
    parted = _same_steps(one, two, ("on 1 process", "on 2"))
    assert parted is None, (
        f"objective={objective_option}: 1 and 2 processes trained differently, first at "
        f"{parted}: each term must be per image or a mean over the images it is given, and "
        "nothing in the objective may change from call to call"
    )


def test_objective_resumes_bit_for_bit_after_a_kill(repro_project: Project, objective_option: str):
    """Killed after step 3 and rerun (resuming from step 2), against a straight run."""
    paired = repro_project.meant_for("objective", objective_option)
    option = f"objective={objective_option}"
    _survives_a_kill(repro_project, option, *paired, option)


def test_metric_gives_the_same_value_for_0_and_2_workers_and_1_and_2_processes(
    repro_project: Project, metrics_option: str
):
    """The metric's validation columns of a world-invariant run: with 0 loader workers, with
    2, and on 2 processes (each scores its shard; the states are summed)."""
    paired = repro_project.meant_for("metrics", metrics_option)
    chosen = [] if paired else [f"metrics=[{metrics_option}]"]
    what = f"metrics={metrics_option}"
    runs = {}
    for name, workers in (("0 workers", 0), ("2 workers", 2)):
        cfg = repro_project.config(
            *paired, *chosen, *INVARIANT, f"dataloader.num_workers={workers}"
        )
        with promise(f"{what}: training with {name}", bool(paired)):
            runs[name] = repro_project.runs.straight(cfg)
    with promise(f"{what}: training on 2 processes", bool(paired)):
        runs["2 processes"] = repro_project.runs.on_two_processes(cfg)
    values = {name: _columns(run, f"val_{metrics_option}") for name, run in runs.items()}
    assert values["0 workers"], f"{what}: metrics.csv has no val_{metrics_option} column"
    for name in ("2 workers", "2 processes"):
        assert values[name] == values["0 workers"], (
            f"{what}: with 0 workers {values['0 workers']}, with {name} {values[name]}: a "
            "metric's states must be counts summed over the images (add_state(..., "
            'dist_reduce_fx="sum")) and its value computed from them alone'
        )


def _columns(run: Path, prefix: str) -> list[dict[str, str]]:
    """Each evaluation's values of metrics.csv's columns named `prefix` or `prefix_*`."""
    with (run / "metrics.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    found = []
    for row in rows:
        kept = {k: v for k, v in row.items() if k == prefix or k.startswith(f"{prefix}_")}
        if any(kept.values()):
            found.append(kept)
    return found


def test_stateful_part_resumes_bit_for_bit_after_a_kill(
    repro_project: Project, stateful_option: str
):
    """A run with the part (with the experiment that adds it, if one does: a callback written
    for some data runs on it), killed after step 3 and rerun, against a straight run: the same
    steps, weights and files (the part's own included)."""
    group, _, name = stateful_option.partition("=")
    paired = repro_project.meant_for(group, name)  # an experiment that adds it, else added
    _survives_a_kill(repro_project, stateful_option, *(paired or [f"+{group}={name}"]))


def test_experiment_runs_what_it_says_and_survives_a_kill(
    repro_project: Project, experiment_option: str
):
    """Every group and key the experiment sets is in the composed config (nothing composed
    after it overrides them); then it runs, killed and rerun, as a straight run does."""
    dropped = repro_project.dropped_choices(experiment_option)
    assert not dropped, (
        f"experiment={experiment_option} is not what runs: it asks for {'; '.join(dropped)}; "
        "something composed after it overrides that (a project's own choices belong in "
        "conf/project/default.yaml, which comes before experiments, not in conf/config.yaml)"
    )
    option = f"experiment={experiment_option}"
    _survives_a_kill(repro_project, option, option)


def test_the_default_config_survives_a_kill(repro_project: Project):
    """The default config (with the project's callbacks) killed after step 3, one step past
    its checkpoint, and run again: the weights and files of a straight run."""
    _survives_a_kill(repro_project, "the default config")


def _survives_a_kill(project: Project, what: str, *overrides: str) -> None:
    cfg = project.config(*overrides)
    with promise(f"{what}: training straight"):
        straight = project.runs.straight(cfg)
    with promise(f"{what}: killed after step {KILL_AFTER_STEP} and rerun"):
        rerun = project.runs.killed_and_rerun(cfg)
    how = "killed and rerun"
    parted = _same_steps(straight, rerun, ("straight", how))
    assert parted is None, f"{what}: {how}, it trained differently, first at {parted}: {STATE_RULE}"
    files = result_files(straight), result_files(rerun)
    differ = sorted(
        set(files[0]) ^ set(files[1])
        | {rel for rel in set(files[0]) & set(files[1]) if files[0][rel] != files[1][rel]}
    )
    assert not differ, (
        f"{what}: {how}, it wrote other files than a straight run: {', '.join(differ)}; "
        f"{STATE_RULE}"
    )
