"""The kit's checks (repro.extras.testkit.checks), in this process, against a project whose runs are
folders written here: each check passes runs that agree and fails those that part with the
lines it promises (the option, where the runs parted, the rule to follow). The kit's real runs
of a generated project are test_new_project's and test_testkit_forks'."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from repro.core.errors import ConfigError
from repro.core.runs.fingerprint_log import FingerprintLog
from repro.extras.testkit import checks
from repro.extras.testkit.runs import RunFailedError

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
        """The engine's config for those overrides; else (runs are folders here) a stand-in
        holding the overrides and a data root."""
        self.composed.append(overrides)
        if self.composes:
            return compose_config(*tiny(), *overrides)
        return OmegaConf.create({"overrides": list(overrides), "data": {"root": "/data/here"}})

    def meant_for(self, group: str, option: str) -> list[str]:
        self.meant = (group, option)
        return self.paired

    def dropped_choices(self, experiment: str) -> list[str]:
        self.meant = ("experiment", experiment)
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
    from repro.core import build

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

    class Changing:
        """Item `at` changes `what` on every read: state that changes with calls."""

        def __init__(self, size: int, what: str = "", at: int = 0) -> None:
            self.size, self.what, self.at, self.reads = size, what, at, 0

        def __len__(self) -> int:
            return self.size

        def __getitem__(self, index: int):
            self.reads += index == self.at
            changed = self.reads if index == self.at else 0
            image = torch.zeros(3, 2, 2 + changed * (self.what == "shape"), dtype=torch.uint8)
            image[0, 0, 0] = changed * (self.what == "pixels")
            return image, changed * (self.what == "label")

    class Data:
        def __init__(self, **splits) -> None:
            self.__dict__.update(splits)

    cases = [("shape", 5, 0), ("pixels", 5, 2), ("label", 5, 4), ("pixels", 1, 0)]
    for what, size, at in cases:  # the first, middle and last items are read
        data = Data(train=Changing(4), val=Changing(0), test=Changing(size, what, at))
        monkeypatch.setattr(build, "splits", lambda cfg, seed, data=data: data)
        said = failure(
            checks.test_data_gives_the_same_item_every_time_an_index_is_read, Project(), "mine"
        )
        assert said == f"data=mine: test item {at} read twice gave other {what}: {checks.ITEM_RULE}"
    data = Data(train=Changing(9, "pixels", at=3), val=Changing(0), test=Changing(1))
    monkeypatch.setattr(build, "splits", lambda cfg, seed: data)
    checks.test_data_gives_the_same_item_every_time_an_index_is_read(Project(), "mine")  # unread


def test_the_data_checks_build_from_seed_7_and_fingerprint_under_the_datas_root(monkeypatch):
    from repro.core import build
    from repro.core.data import fingerprint

    built, roots = [], []
    monkeypatch.setattr(build, "splits", lambda cfg, seed: built.append(seed) or "splits")
    monkeypatch.setattr(
        fingerprint, "fingerprint", lambda data, root: roots.append(root) or {"splits": {}}
    )
    checks.test_data_gives_the_same_split_for_the_same_seed(Project(), "d")
    assert built == [7, 7] and roots == ["/data/here"] * 2

    def refused(cfg, seed):
        raise ConfigError("data.root", "/nowhere", "a folder")

    monkeypatch.setattr(build, "splits", refused)
    for check in (
        checks.test_data_gives_the_same_split_for_the_same_seed,
        checks.test_data_gives_the_same_item_every_time_an_index_is_read,
    ):
        said = failure(check, Project(), "d")
        assert said == "data=d: building its splits: " + str(
            ConfigError("data.root", "/nowhere", "a folder")
        )


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
    both = run_folder(tmp_path / "both", [2.5, 2.25], **{"notes.txt": "4", "b.txt": ""})
    cases = ((counted_twice, "notes.txt"), (extra, "b.txt"), (both, "b.txt, notes.txt"))
    for rerun, named in cases:
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
    assert said == (
        "experiment=e is not what runs: it asks for data=mine (composed: synthetic); "
        "optimizer.lr: 0.1 (composed: 0.2); something composed after it overrides that (a "
        "project's own choices belong in conf/project/default.yaml, which comes before "
        "experiments, not in conf/config.yaml)"
    )
    assert dropped.meant == ("experiment", "e")
    assert dropped.runs.asked == []


FAILED = RunFailedError("KeyError: 'x' (at part.py:4)", "")
CHECKS = {  # check, its option, the group meant_for is asked, what the first run promises
    "data": (
        checks.test_data_trains_the_same_steps_with_0_and_2_workers,
        "d",
        "data",
        "data=d: training with 0 loader workers",
    ),
    "objective": (
        checks.test_objective_trains_as_the_trainer_calls_it,
        "o",
        "objective",
        "objective=o: training with it",
    ),
    "processes": (
        checks.test_objective_gives_the_same_steps_on_1_and_2_processes,
        "o",
        "objective",
        "objective=o: training on 1 and 2 processes",
    ),
    "resume": (
        checks.test_objective_resumes_bit_for_bit_after_a_kill,
        "o",
        "objective",
        "objective=o: training straight",
    ),
    "metrics": (
        checks.test_metric_gives_the_same_value_for_0_and_2_workers_and_1_and_2_processes,
        "m",
        "metrics",
        "metrics=m: training with 0 workers",
    ),
    "stateful": (
        checks.test_stateful_part_resumes_bit_for_bit_after_a_kill,
        "callbacks=c",
        "callbacks",
        "callbacks=c: training straight",
    ),
    "experiment": (
        checks.test_experiment_runs_what_it_says_and_survives_a_kill,
        "e",
        "experiment",
        "experiment=e: training straight",
    ),
}
COMPOSED = {  # the first run's overrides, unpaired and paired with experiment=p
    "data": (("data=d", "dataloader.num_workers=0"),) * 2,
    "objective": (("objective=o",),) * 2,
    "processes": (("objective=o", *checks.INVARIANT),) * 2,
    "resume": (("objective=o",),) * 2,
    "metrics": (
        ("metrics=[m]", *checks.INVARIANT, "dataloader.num_workers=0"),
        (*checks.INVARIANT, "dataloader.num_workers=0"),
    ),
    "stateful": (("+callbacks=c",), ()),
    "experiment": (("experiment=e",), ("experiment=e",)),
}
UNHINTED = ("resume", "stateful", "experiment")  # their first run's promise is the kill's


@pytest.mark.parametrize("name", list(CHECKS))
@pytest.mark.parametrize("paired", [[], ["experiment=p"]])
def test_each_check_asks_for_its_pairing_composes_it_and_names_its_promise(name, paired):
    check, option, group, promised = CHECKS[name]
    project = Project(FAILED, paired=paired)
    said = failure(check, project, option)
    hint = "" if paired or name in UNHINTED else f"; {checks.PAIRING}"
    assert said == f"{promised}: the run failed: {FAILED.line}{hint}"
    expected = list(COMPOSED[name][bool(paired)])
    if paired and name != "experiment":
        expected = [*paired, *expected]
    assert project.composed == [tuple(expected)]
    assert project.meant == (group, option.partition("=")[2] or option)
    ((_, given),) = project.runs.asked
    assert list(given.overrides) == expected  # the run is of the config composed


def test_a_later_run_that_fails_names_its_own_promise(tmp_path):
    done, failed = metrics_run(tmp_path / "done", ["0.5"]), f"the run failed: {FAILED.line}"
    metric = Project(done, done, FAILED)
    said = failure(
        checks.test_metric_gives_the_same_value_for_0_and_2_workers_and_1_and_2_processes,
        metric,
        "m",
    )
    assert said == f"metrics=m: training on 2 processes: {failed}; {checks.PAIRING}"
    (_, zero), (_, two), (_, ranks) = metric.runs.asked
    assert ranks is two and zero is not two  # two processes run the last config made
    objective = Project(done, FAILED)
    said = failure(checks.test_objective_gives_the_same_steps_on_1_and_2_processes, objective, "o")
    assert said == f"objective=o: training on 1 and 2 processes: {failed}; {checks.PAIRING}"
    (_, one), (_, both) = objective.runs.asked
    assert one is both  # one config, on 1 process and on 2
    default = Project(done, FAILED)
    said = failure(checks.test_the_default_config_survives_a_kill, default)
    assert said == f"the default config: killed after step 3 and rerun: {failed}"
    (_, straight), (_, killed) = default.runs.asked
    assert straight is killed and list(straight.overrides) == []
