"""The kit's checks (repro.testkit.checks), in this process, against a project whose runs are
folders written here: each check passes runs that agree and fails those that part with the
lines it promises (the option, where the runs parted, the rule to follow). The kit's real runs
of a generated project are test_new_project's and test_testkit_forks'."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from repro.errors import ConfigError
from repro.runs.fingerprint_log import FingerprintLog
from repro.testkit import checks
from repro.testkit.runs import RunFailedError

from conftest import compose_config, tiny


def run_folder(folder: Path, losses: list[float], digest: str = "ab" * 32, **files: str) -> Path:
    """A run's folder as the kit reads it: fingerprints.csv, with the weights hash on the last
    step, and files of the run's own beside it."""
    folder.mkdir(parents=True)
    FingerprintLog.of_run(folder).append(1, losses, digest)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


class Runs:
    """The project's runs: each call takes the next folder, in the order the check asks."""

    def __init__(self, *folders: Path | Exception) -> None:
        self.folders, self.asked = list(folders), []

    def _next(self, how: str, cfg) -> Path:
        self.asked.append((how, cfg))
        given = self.folders.pop(0)
        if isinstance(given, Exception):
            raise given
        return given

    def straight(self, cfg) -> Path:
        return self._next("straight", cfg)

    def killed_and_rerun(self, cfg) -> Path:
        return self._next("killed", cfg)

    def on_two_processes(self, cfg) -> Path:
        return self._next("two processes", cfg)


class Project:
    """A project of the engine's options; `paired` is what `meant_for` answers (an
    experiment's choice, or nothing), `dropped` what `dropped_choices` does."""

    def __init__(self, *folders, paired=(), dropped=(), composes: bool = False) -> None:
        self.runs, self.paired, self.dropped = Runs(*folders), list(paired), list(dropped)
        self.composes, self.composed = composes, []

    def config(self, *overrides: str):
        """The engine's config for those overrides; else (runs are folders here) the
        overrides alone."""
        self.composed.append(overrides)
        return compose_config(*tiny(), *overrides) if self.composes else overrides

    def meant_for(self, group: str, option: str) -> list[str]:
        self.meant = (group, option)
        return self.paired

    def dropped_choices(self, experiment: str) -> list[str]:
        return self.dropped


def failure(check, *args) -> str:
    """The check's own lines, without the `assert ...` pytest's rewriting adds below them."""
    with pytest.raises(AssertionError) as raised:
        check(*args)
    return str(raised.value).split("\nassert ")[0]


def test_two_runs_part_at_their_first_differing_step_or_where_one_runs_short(tmp_path):
    one = run_folder(tmp_path / "one", [2.5, 2.25, 2.0])
    same = run_folder(tmp_path / "same", [2.5, 2.25, 2.0])
    other_loss = run_folder(tmp_path / "loss", [2.5, 2.125, 2.0])
    other_weights = run_folder(tmp_path / "weights", [2.5, 2.25, 2.0], digest="cd" * 32)
    short = run_folder(tmp_path / "short", [2.5, 2.25])
    names = ("straight", "killed")
    assert checks._same_steps(one, same, names) is None
    assert checks._same_steps(one, other_loss, names) == "step 2: loss 2.25 straight, 2.125 killed"
    parted = checks._same_steps(one, other_weights, names)
    assert parted == f"step 3: weights hash {'ab' * 8} straight, {'cd' * 8} killed"
    expected = "step 3: recorded straight only, or killed only"
    assert checks._same_steps(one, short, names) == checks._same_steps(short, one, names)
    assert checks._same_steps(one, short, names) == expected


def test_a_failed_run_or_a_refused_config_is_a_few_lines_naming_the_promise():
    failed = RunFailedError("ValueError: bad (data.py:3)", "Traceback ...")
    with pytest.raises(AssertionError) as raised, checks.promise("data=x: training"):
        raise failed
    assert str(raised.value) == "data=x: training: the run failed: ValueError: bad (data.py:3)"
    assert raised.value.__cause__ is failed
    with pytest.raises(AssertionError) as raised, checks.promise("data=x: training", False):
        raise failed
    assert str(raised.value).endswith(f"(data.py:3); {checks.PAIRING}")
    refused = ConfigError("data.root", "/nowhere", "a folder")
    with pytest.raises(AssertionError) as raised, checks.promise("data=x"):
        raise refused
    assert str(raised.value) == f"data=x: {refused}"
    with pytest.raises(KeyError), checks.promise("data=x"):
        raise KeyError("a bug of the kit's own is not dressed as a broken promise")


def test_a_dataset_whose_split_or_items_change_between_reads_fails_naming_them(monkeypatch):
    from repro import build

    project = Project(composes=True)
    checks.test_data_gives_the_same_split_for_the_same_seed(project, "synthetic")
    checks.test_data_gives_the_same_item_every_time_an_index_is_read(project, "synthetic")
    assert project.composed == [("data=synthetic",), ("data=synthetic",)]
    built, drawn = build.splits, iter(range(100))
    monkeypatch.setattr(build, "splits", lambda cfg, seed: built(cfg, seed + next(drawn)))
    said = failure(checks.test_data_gives_the_same_split_for_the_same_seed, project, "synthetic")
    assert said.startswith(
        "data=synthetic: built twice from seed 7, the train and val split(s) held other "
        "items: the builder must make the same split for the same seed"
    )

    class Drawing:
        """Items drawn from the global generator on each read: the rule's first example."""

        def __init__(self, size: int, what: str) -> None:
            self.size, self.what = size, what

        def __len__(self) -> int:
            return self.size

        def __getitem__(self, index: int):
            image = torch.zeros(3, 2, 2, dtype=torch.uint8)
            if self.what == "pixels":
                image[0, 0, 0] = int(torch.randint(0, 256, ()))
            shape = (3, 2, 2 + int(torch.randint(0, 9, ()))) if self.what == "shape" else None
            label = int(torch.randint(0, 10**6, ())) if self.what == "label" else 0
            return (image if shape is None else torch.zeros(shape)), label

    class Data:
        def __init__(self, **splits) -> None:
            self.__dict__.update(splits)

    for what in ("shape", "pixels", "label"):
        steady = Drawing(4, "none")
        data = Data(train=steady, val=Drawing(0, what), test=Drawing(5, what))
        monkeypatch.setattr(build, "splits", lambda cfg, seed, data=data: data)
        said = failure(
            checks.test_data_gives_the_same_item_every_time_an_index_is_read, Project(), "mine"
        )
        assert said.startswith(f"data=mine: test item 0 read twice gave other {what}: ")
        assert checks.ITEM_RULE in said


def test_a_dataset_that_trains_otherwise_with_workers_fails_with_the_step(tmp_path):
    alike = [run_folder(tmp_path / name, [2.5, 2.25]) for name in ("a", "b")]
    project = Project(*alike, paired=["experiment=mine"])
    checks.test_data_trains_the_same_steps_with_0_and_2_workers(project, "mine")
    assert project.meant == ("data", "mine")
    workers = [
        (overrides[0], overrides[-1]) for overrides in project.composed
    ]  # the pairing first, the worker count last
    assert workers == [
        ("experiment=mine", "dataloader.num_workers=0"),
        ("experiment=mine", "dataloader.num_workers=2"),
    ]
    apart = run_folder(tmp_path / "c", [2.5, 2.0])
    said = failure(
        checks.test_data_trains_the_same_steps_with_0_and_2_workers,
        Project(alike[0], apart),
        "mine",
    )
    assert said == (
        "data=mine: 0 and 2 loader workers trained differently, first at step 2: loss 2.25 "
        f"with 0 workers, 2.0 with 2; {checks.ITEM_RULE}"
    )
    broken = Project(alike[0], RunFailedError("OSError: gone (data.py:9)", ""))
    said = failure(checks.test_data_trains_the_same_steps_with_0_and_2_workers, broken, "mine")
    assert said == (
        "data=mine: training with 2 loader workers: the run failed: OSError: gone (data.py:9); "
        f"{checks.PAIRING}"
    )


def test_an_objective_must_give_finite_losses_and_the_same_steps_on_two_processes(tmp_path):
    finite = run_folder(tmp_path / "finite", [2.5, 0.0])
    checks.test_objective_trains_as_the_trainer_calls_it(Project(finite), "mine")
    for loss in ("nan", "inf"):
        broken = run_folder(tmp_path / loss, [2.5, float(loss)])
        said = failure(checks.test_objective_trains_as_the_trainer_calls_it, Project(broken), "o")
        assert said.startswith(f"objective=o: losses [2.5, {loss}]: every step's loss")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "fingerprints.csv").write_text("")
    said = failure(checks.test_objective_trains_as_the_trainer_calls_it, Project(empty), "o")
    assert said.startswith("objective=o: losses []: ")

    project = Project(finite, finite)
    checks.test_objective_gives_the_same_steps_on_1_and_2_processes(project, "o")
    assert [how for how, _ in project.runs.asked] == ["straight", "two processes"]
    assert project.composed == [("objective=o", *checks.INVARIANT)]
    apart = run_folder(tmp_path / "apart", [2.25, 0.0])
    said = failure(
        checks.test_objective_gives_the_same_steps_on_1_and_2_processes, Project(finite, apart), "o"
    )
    assert said.startswith(
        "objective=o: 1 and 2 processes trained differently, first at step 1: loss 2.5 on 1 "
        "process, 2.25 on 2: each term must be per image"
    )


def metrics_run(folder: Path, values: list[str]) -> Path:
    rows = ["step,train_loss,val_acc,val_top5,val_top5_a,val_top50"]
    rows += [f"{step},1.0,0.5,{value},{value},9" for step, value in enumerate(values, 1)]
    rows.append("9,1.0,,,,")  # a step's row without evaluation
    return run_folder(folder, [1.0], **{"metrics.csv": "\n".join(rows) + "\n"})


def test_a_metric_must_give_the_same_values_with_workers_and_processes(tmp_path):
    runs = [metrics_run(tmp_path / name, ["0.75", "0.5"]) for name in ("a", "b", "c")]
    project = Project(*runs)
    checks.test_metric_gives_the_same_value_for_0_and_2_workers_and_1_and_2_processes(
        project, "top5"
    )
    assert project.composed == [
        ("metrics=[top5]", *checks.INVARIANT, f"dataloader.num_workers={workers}")
        for workers in (0, 2)
    ]
    assert [how for how, _ in project.runs.asked] == ["straight", "straight", "two processes"]
    assert checks._columns(runs[0], "val_top5") == [
        {"val_top5": "0.75", "val_top5_a": "0.75"},
        {"val_top5": "0.5", "val_top5_a": "0.5"},
    ]
    other = metrics_run(tmp_path / "other", ["0.75", "0.25"])
    said = failure(
        checks.test_metric_gives_the_same_value_for_0_and_2_workers_and_1_and_2_processes,
        Project(runs[0], runs[1], other, paired=["experiment=e"]),
        "top5",
    )
    assert said.startswith("metrics=top5: with 0 workers [{'val_top5': '0.75', ")
    assert ", with 2 processes [{" in said and "'0.25'" in said
    assert 'add_state(..., dist_reduce_fx="sum")' in said
    unnamed = metrics_run(tmp_path / "unnamed", [])
    said = failure(
        checks.test_metric_gives_the_same_value_for_0_and_2_workers_and_1_and_2_processes,
        Project(unnamed, unnamed, unnamed),
        "top5",
    )
    assert said == "metrics=top5: metrics.csv has no val_top5 column"


def test_a_kill_and_rerun_must_train_and_write_as_a_straight_run(tmp_path):
    straight = run_folder(tmp_path / "straight", [2.5, 2.25], **{"notes.txt": "3 calls"})
    again = run_folder(tmp_path / "again", [2.5, 2.25], **{"notes.txt": "3 calls"})
    project = Project(straight, again, paired=["experiment=e"])
    checks.test_stateful_part_resumes_bit_for_bit_after_a_kill(project, "callbacks=counter")
    assert project.meant == ("callbacks", "counter") and project.composed == [("experiment=e",)]
    added = Project(straight, again)
    checks.test_stateful_part_resumes_bit_for_bit_after_a_kill(added, "callbacks=counter")
    assert added.composed == [("+callbacks=counter",)]
    assert [how for how, _ in added.runs.asked] == ["straight", "killed"]

    counted_twice = run_folder(tmp_path / "twice", [2.5, 2.25], **{"notes.txt": "4 calls"})
    extra = run_folder(tmp_path / "extra", [2.5, 2.25], **{"notes.txt": "3 calls", "b.txt": ""})
    for rerun, named in ((counted_twice, "notes.txt"), (extra, "b.txt")):
        said = failure(checks.test_the_default_config_survives_a_kill, Project(straight, rerun))
        assert said == (
            "the default config: killed and rerun, it wrote other files than a straight run: "
            f"{named}; {checks.STATE_RULE}"
        )
    parted = run_folder(tmp_path / "parted", [2.5, 2.0], **{"notes.txt": "3 calls"})
    said = failure(
        checks.test_objective_resumes_bit_for_bit_after_a_kill, Project(straight, parted), "o"
    )
    assert said == (
        "objective=o: killed and rerun, it trained differently, first at step 2: loss 2.25 "
        f"straight, 2.0 killed and rerun: {checks.STATE_RULE}"
    )
    refused = Project(straight, RunFailedError("KeyError: 'x' (cb.py:4)", ""))
    said = failure(checks.test_the_default_config_survives_a_kill, refused)
    assert said == (
        "the default config: killed after step 3 and rerun: the run failed: KeyError: 'x' (cb.py:4)"
    )


def test_an_experiment_runs_only_if_it_is_what_composes(tmp_path):
    straight = run_folder(tmp_path / "straight", [2.5])
    project = Project(straight, straight)
    checks.test_experiment_runs_what_it_says_and_survives_a_kill(project, "e")
    assert project.composed == [("experiment=e",)]
    dropped = Project(
        dropped=["data=mine (composed: synthetic)", "optimizer.lr: 0.1 (composed: 0.2)"]
    )
    said = failure(checks.test_experiment_runs_what_it_says_and_survives_a_kill, dropped, "e")
    assert re.fullmatch(
        r"experiment=e is not what runs: it asks for data=mine \(composed: synthetic\); "
        r"optimizer\.lr: 0\.1 \(composed: 0\.2\); something composed after it overrides that .*",
        said,
    )
    assert dropped.runs.asked == []
