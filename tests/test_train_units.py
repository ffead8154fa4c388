"""repro.train's own steps, in this process: what summary.json holds and where each field comes
from, the attempt's line in the run history, a halted run and its resume, a rerun with nothing
to do, and the small helpers (the attempt's result, the scores line, the value a sweeper
optimises, a refusing file system told as a user's error)."""

from __future__ import annotations

import csv
import errno
import json
import time

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from repro import train
from repro.core import build, run
from repro.core.data import synthetic
from repro.core.errors import StorageError, UserError
from repro.core.runs import checkpoint, run_lock
from repro.core.runtime import determinism, distributed, environment, seeding
from repro.core.sweeps import ERROR_FILE

from conftest import IMAGEFOLDER, compose_config, make_image_tree, tiny, train_in_process

STEPS = 6  # 384 training images in batches of 64, one epoch


class Logged:
    """repro.train's logger as the run and main call it, whatever logging's setup: each
    call's level, line and whether a traceback goes."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bool]] = []

    @property
    def lines(self) -> list[str]:
        return [line for _, line, _ in self.calls]

    def _keep(self, level: str, message: str, *args: object, exc_info: bool = False) -> None:
        self.calls.append((level, message % args, exc_info))

    def info(self, message: str, *args: object, **kwargs: bool) -> None:
        self._keep("info", message, *args, **kwargs)

    def warning(self, message: str, *args: object, **kwargs: bool) -> None:
        self._keep("warning", message, *args, **kwargs)

    def error(self, message: str, *args: object, **kwargs: bool) -> None:
        self._keep("error", message, *args, **kwargs)


@pytest.fixture
def straight(tmp_path):
    """One tiny run from start to end: its folder, summary, what it logged and how long the
    call took; and what the end handed the callbacks and the trackers. A fixture of each test
    (not of the module): mutmut maps a mutant to the tests whose own calls reach it."""
    from repro.core.watch.callbacks import Callbacks
    from repro.core.watch.loggers import MetricsLog

    run_dir, said, ended = tmp_path / "straight", Logged(), {}
    real_end, real_finish = Callbacks.at_end, MetricsLog.finish

    def at_end(self, loop, summary):
        ended["callbacks"] = (loop, dict(summary))
        real_end(self, loop, summary)

    def finish(self, summary):
        ended["trackers"] = dict(summary)
        real_finish(self, summary)

    started = time.perf_counter()
    with pytest.MonkeyPatch.context() as patch:  # its own: a test's patches stay the test's
        patch.setattr(run, "log", said)
        patch.setattr(Callbacks, "at_end", at_end)
        patch.setattr(MetricsLog, "finish", finish)
        summary = train_in_process(run_dir, *tiny())
    return run_dir, summary, said.lines, time.perf_counter() - started, ended


def _attempts(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]


def test_the_summary_says_how_the_run_got_there(straight):
    run_dir, summary, _, took, ended = straight
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    assert summary["step"] == summary["total_steps"] == STEPS
    assert summary["completed"] is True and summary["resumed_from_step"] is None
    assert summary["stopped_early"] is False and summary["stop_reason"] is None
    assert summary["stopped_by_signal"] is None and summary["init_weights"] is None
    assert summary["seed"] == 0 and summary["world_size"] == 1
    assert summary["amp"] == "off" and summary["amp_emulated"] is False
    assert summary["memory_format"] == "channels_last" and summary["pin_memory"] is False
    assert 0 < summary["train_s"] < summary["wall_s"] < took
    model = build.model(compose_config(*tiny()), root_seed=0, num_classes=10)
    assert summary["parameters"] == sum(p.numel() for p in model.parameters())
    with (run_dir / "metrics.csv").open() as handle:
        evaluations = [row for row in csv.DictReader(handle) if row.get("val_acc")]
    best = max(evaluations, key=lambda row: float(row["val_acc"]))
    assert summary["best_val_acc"] == float(best["val_acc"])
    assert summary["best_step"] == int(best["step"])
    assert summary["val_acc"] == float(evaluations[-1]["val_acc"])
    assert summary["flags"] == json.loads(json.dumps(determinism.snapshot()))
    assert summary["env"] == json.loads(json.dumps(environment.describe(torch.device("cpu"))))
    assert summary["normalisation"]["mean"] == [0.5, 0.5, 0.5]
    splits = summary["data"]["splits"]
    assert [splits[name]["images"] for name in ("train", "val", "test")] == [384, 128, 128]
    assert len(summary["weights_sha256"]) == 64 and "test_acc" in summary
    loop, told = ended["callbacks"]  # the end hands callbacks and trackers the summary
    assert told == summary == ended["trackers"] and loop.state.position.step == STEPS
    assert not (run_dir / "curves.png").exists(), "logger.plot=false"


def test_the_run_records_its_config_its_attempt_and_what_it_trains(straight):
    run_dir, summary, said, _, _ = straight
    resolved = yaml.safe_load((run_dir / "resolved_config.yaml").read_text())
    assert resolved["seed"]["value"] == 0 and resolved["trainer"]["monitor"] == "val_acc"
    asked = OmegaConf.to_container(compose_config(*tiny()), resolve=True)
    assert resolved == asked | {"trainer": asked["trainer"] | {"monitor": "val_acc"}}
    kept = checkpoint.load(run_dir / "checkpoints" / "last.pt")
    assert kept["config"] == resolved and kept["root_seed"] == 0 and kept["init_weights"] is None
    assert kept["classes"] == list(synthetic.CLASSES)
    assert kept["split_sizes"] == {"train": 384, "val": 128, "test": 128}
    assert kept["split_digests"] == {}, "synthetic data: no files to digest"
    (attempt,) = _attempts(run_dir)
    assert (attempt["start_step"], attempt["end_step"]) == (0, STEPS)
    assert attempt["result"] == "completed" and attempt["env"] == summary["env"]
    described = (
        f"training SmallCNN (0.00M parameters) on cpu | 384 train / 128 val images | {STEPS} "
        "steps | seed 0 | amp off | channels_last"
    )
    assert said == [described]


def test_a_rerun_of_a_finished_run_has_nothing_to_do_and_writes_nothing(straight):
    run_dir, summary, _, _, _ = straight
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    again = train_in_process(run_dir, *tiny())
    assert again == {**summary, "already_complete": True}
    assert {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()} == before


def test_a_halted_run_resumes_to_the_straight_runs_weights(straight, tmp_path, monkeypatch):
    run_dir = tmp_path / "halted"
    halted = train_in_process(run_dir, *tiny("trainer.halt_at_step=3"))
    assert halted["step"] == 3 and halted["completed"] is False
    assert halted["train_s"] > 0, "no evaluation yet: the position's own time"
    assert _attempts(run_dir)[-1]["result"] == "halted"
    said = Logged()
    monkeypatch.setattr(run, "log", said)
    resumed = train_in_process(run_dir, *tiny())
    assert resumed["resumed_from_step"] == 3 and resumed["step"] == STEPS
    assert resumed["weights_sha256"] == straight[1]["weights_sha256"]
    first, second = _attempts(run_dir)
    assert (first["end_step"], second["start_step"], second["end_step"]) == (3, 3, STEPS)
    assert second["result"] == "completed" and second["resumed_from"]
    loaded = run_dir / "checkpoints" / "last.pt"
    assert said.lines[0] == f"resumed from {loaded} at epoch 0, batch 3, step 3"
    kept = sorted(path.name for path in loaded.parent.glob("step-*.pt"))
    assert kept == ["step-00000003.pt", "step-00000006.pt"], "keep_checkpoints=2"


def test_a_resume_settles_best_pt_to_the_best_its_checkpoint_records(tmp_path, monkeypatch):
    evaluated = tiny("trainer.eval_every_steps=2")  # a best at step 2, before the halt
    train_in_process(tmp_path, *evaluated, "trainer.halt_at_step=3")
    best_step = checkpoint.load(tmp_path / "checkpoints" / "last.pt")["best"]["step"]
    settled, real_settle = [], checkpoint.Checkpointer.settle_best
    monkeypatch.setattr(
        checkpoint.Checkpointer,
        "settle_best",
        lambda self, step: settled.append(step) or real_settle(self, step),
    )
    train_in_process(tmp_path, *evaluated)
    assert best_step == 2 and settled == [2]


def test_a_failing_run_closes_its_attempt_with_the_error(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the model would not build")

    monkeypatch.setattr(run.assembly, "trainer", broken)
    with pytest.raises(RuntimeError, match="would not build"):
        train_in_process(tmp_path, *tiny())
    (attempt,) = _attempts(tmp_path)
    assert attempt["result"] == "failed: the model would not build"
    assert attempt["end_step"] == 0 and not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize(
    "fields, result",
    [
        (
            {"stopped_by_signal": 15, "stop_reason": "patience", "completed": True},
            "stopped by signal 15",
        ),
        (
            {"stopped_by_signal": None, "stop_reason": "patience", "completed": True},
            "completed, stopped early: patience",
        ),
        ({"stopped_by_signal": None, "stop_reason": None, "completed": True}, "completed"),
        ({"stopped_by_signal": None, "stop_reason": None, "completed": False}, "halted"),
    ],
)
def test_an_attempts_result_reads_from_its_summary(fields, result):
    assert run._result(fields) == result


@pytest.mark.parametrize(
    "summary, line, swept",
    [
        (
            {"val_acc": 0.5, "val_loss": 1.25, "test_acc": 0.75},
            "val_acc 0.5000 val_loss 1.2500",
            0.5,
        ),
        ({"test_acc": 0.25, "test_loss": 2.0}, "test_acc 0.2500 test_loss 2.0000", 0.25),
        ({"val_acc": 0.125}, "val_acc 0.1250", 0.125),
        ({}, "no evaluation", None),
    ],
)
def test_the_scores_line_and_the_swept_value_prefer_validation_to_test(summary, line, swept):
    assert train._scores(summary) == line
    assert train._swept_value(summary) == swept


def test_a_refusing_file_system_is_a_users_error_saying_the_run_resumes(tmp_path):
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "metrics.csv"))
    told = train._as_user_error(full, tmp_path)
    assert isinstance(told, UserError)
    assert str(told).startswith(f"cannot use {tmp_path / 'metrics.csv'}: ")
    assert "No space left on device" in str(told)
    assert str(told).endswith(
        "; the files written before are intact: free space (or fix the file system), then run "
        "the same command to resume"
    )
    nameless = train._as_user_error(OSError(errno.EROFS, "Read-only file system"), tmp_path)
    assert isinstance(nameless, UserError) and str(tmp_path) in str(nameless)
    refused = StorageError(tmp_path / "summary.json", full, doing="write")
    assert str(train._as_user_error(refused, tmp_path)).startswith(str(refused) + "; ")
    bug = ValueError("a bug")
    assert train._as_user_error(bug, tmp_path) is bug


def test_a_failed_jobs_error_is_noted_for_the_sweep_report_unless_the_disk_refuses(
    tmp_path, monkeypatch
):
    train._note_failure(tmp_path, ValueError("bad value"))
    assert (tmp_path / ERROR_FILE).read_text() == "ValueError: bad value\n"

    def refuse(path, text):
        raise StorageError(path, OSError(errno.ENOSPC, "No space left on device"), doing="write")

    monkeypatch.setattr(train, "write_text_atomic", refuse)
    said = Logged()
    monkeypatch.setattr(train, "log", said)
    train._note_failure(tmp_path / "full", KeyError("k"))
    (line,) = said.lines
    assert line.endswith(": the sweep report will not see why this job failed")
    assert str(tmp_path / "full" / ERROR_FILE) in line


def test_the_seed_is_the_checkpoints_when_resuming_else_the_configs_or_one_drawn():
    alone = distributed.Context(rank=0, world=1, local_rank=0)
    fixed = compose_config("seed=7")
    assert run._root_seed(fixed, None, alone) == 7
    assert run._root_seed(fixed, {"root_seed": 7}, alone) == 7
    drawn = compose_config("seed=random")
    assert run._root_seed(drawn, {"root_seed": "12"}, alone) == 12
    seeds = {run._root_seed(drawn, None, alone) for _ in range(3)}
    assert len(seeds) == 3 and all(isinstance(seed, int) and seed >= 0 for seed in seeds)


# ---- main: what the command says and returns for each way a run ends -----------------------


@pytest.fixture
def command(tmp_path, monkeypatch):
    """train.main as Hydra calls it in a run (or, with `sweep`, a job of a multirun) in
    `tmp_path`, with `train` itself stood in for: returns call(outcome, sweep) -> (the value
    main returns, the log calls, the folders released)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict

    from conftest import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        full = compose(config_name="config", overrides=tiny(), return_hydra_config=True)
    with open_dict(full):
        full.hydra.runtime.output_dir = str(tmp_path)
    cfg = full.copy()
    with open_dict(cfg):
        del cfg["hydra"]
    holder = HydraConfig.instance()
    monkeypatch.setattr(holder, "cfg", None)

    def call(outcome, sweep: bool = False):
        this = full.copy()  # set_config makes the one it holds read-only
        OmegaConf.set_readonly(this, False)
        this.hydra.mode = RunMode.MULTIRUN if sweep else RunMode.RUN
        holder.set_config(this)
        logged, released = Logged(), []

        def stand_in(cfg_given, run_dir):
            assert cfg_given is cfg and run_dir == tmp_path
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        monkeypatch.setattr(run, "train", stand_in)
        monkeypatch.setattr(train, "log", logged)
        monkeypatch.setattr(run_lock, "release", released.append)
        return train.main(cfg), logged.calls, released

    return call


FINISHED = {
    "already_complete": False,
    "stopped_by_signal": None,
    "completed": True,
    "step": 6,
    "val_acc": 0.25,
    "val_loss": 2.5,
    "wall_s": 3.21,
    "weights_sha256": "0123456789abcdef99",
}


def test_a_finished_run_says_its_scores_time_and_weights_and_returns_what_a_sweep_optimises(
    command, tmp_path
):
    value, logged, released = command(FINISHED)
    assert value == 0.25 and released == [tmp_path]
    said = "done | val_acc 0.2500 val_loss 2.5000 | 3.2 s | weights_sha256 0123456789abcdef | "
    assert logged == [("info", said + str(tmp_path), False)]


def test_a_rerun_with_nothing_to_do_says_so_on_stdout_and_returns_the_value(
    command, tmp_path, capsys
):
    value, logged, _ = command({**FINISHED, "already_complete": True})
    assert value == 0.25 and logged == []
    assert capsys.readouterr().out == (
        f"already complete: {tmp_path} holds all 6 steps of this config (val_acc 0.2500 "
        "val_loss 2.5000); nothing to do. To train longer, raise trainer.epochs or "
        "trainer.max_steps.\n"
    )


def test_a_halted_run_says_where_and_returns_nothing(command):
    value, logged, _ = command({**FINISHED, "completed": False, "step": 4})
    assert value is None
    assert logged == [("info", "halted after step 4 as asked (trainer.halt_at_step)", False)]


def test_a_run_stopped_by_a_signal_exits_with_its_code_or_in_a_sweep_returns_nothing(
    command, tmp_path
):
    stopped = {**FINISHED, "stopped_by_signal": 15, "step": 4}
    with pytest.raises(SystemExit) as ended:
        command(stopped)
    assert ended.value.code == 128 + 15
    value, logged, released = command(stopped, sweep=True)
    assert value is None and released == [tmp_path]
    assert logged == [("warning", "stopped by signal 15 at step 4", False)]


def test_outside_a_sweep_a_users_error_is_one_line_and_a_bug_its_traceback(
    command, tmp_path, capsys
):
    with pytest.raises(SystemExit) as ended:
        command(UserError("data.root is missing"))
    assert ended.value.code == 2
    assert capsys.readouterr().err == "error: data.root is missing\n"
    with pytest.raises(SystemExit):
        command(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "m.csv")))
    assert "the files written before are intact" in capsys.readouterr().err
    with pytest.raises(ValueError, match="a bug"):
        command(ValueError("a bug"))
    assert not (tmp_path / ERROR_FILE).exists()


def test_in_a_sweep_a_failed_job_is_logged_noted_for_the_report_and_the_sweep_goes_on(
    command, tmp_path
):
    value, logged, released = command(ValueError("a bug"), sweep=True)
    assert value is None and released == [tmp_path]
    assert logged == [("error", "job failed: a bug", True)]
    assert (tmp_path / ERROR_FILE).read_text() == "ValueError: a bug\n"
    # The line may quote a file's values: no escape sequence reaches the console.
    value, logged, _ = command(UserError("bad\x1b[31m value"), sweep=True)
    assert value is None and logged == [("error", "job failed: bad\\x1b[31m value", False)]
    assert (tmp_path / ERROR_FILE).read_text() == "UserError: bad\x1b[31m value\n"


def test_in_a_sweep_a_folder_another_run_holds_or_an_unsafe_one_gets_no_error_file(
    command, tmp_path, capsys
):
    from repro.core.guards.folders import UnsafeFolderError
    from repro.core.runs.run_lock import RunFolderInUseError

    value, logged, _ = command(RunFolderInUseError("in use by pid 7"), sweep=True)
    assert value is None and logged == [("error", "job failed: in use by pid 7", False)]
    assert not (tmp_path / ERROR_FILE).exists()
    value, logged, _ = command(UnsafeFolderError("train.log links out"), sweep=True)
    assert value is None and logged == []
    assert capsys.readouterr().err == "error: job failed: train.log links out\n"
    assert not (tmp_path / ERROR_FILE).exists()


def test_a_run_stopped_early_is_complete_at_its_own_last_step_and_one_cut_short_is_not(
    tmp_path, monkeypatch
):
    asked = []
    monkeypatch.setattr(run.history, "already_complete", lambda *args: asked.append(args) or True)
    assert run._already_complete(tmp_path, {"position": {"step": 4}, "stopped_early": True}, 6)
    assert run._already_complete(tmp_path, {"position": {"step": 4}}, 6)
    assert asked == [(tmp_path, 4, 4), (tmp_path, 4, 6)]


def test_a_run_asked_to_plot_draws_its_curves(tmp_path):
    train_in_process(tmp_path, *tiny("trainer.max_steps=2", "logger.plot=true"))
    assert (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")


def test_a_summary_linked_from_outside_the_folder_is_refused(tmp_path):
    outside = tmp_path / "theirs.json"
    outside.write_text('{"step": 99}')
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").symlink_to(outside)
    with pytest.raises(UserError, match=r"summary\.json"):
        run.read_summary(run_dir)


def test_the_config_asked_for_is_never_written_to(tmp_path):
    cfg = compose_config(*tiny("seed=random", "trainer.max_steps=2"))
    asked = OmegaConf.to_yaml(cfg)
    summary = run.train(cfg, tmp_path)
    assert OmegaConf.to_yaml(cfg) == asked
    recorded = yaml.safe_load((tmp_path / "resolved_config.yaml").read_text())
    assert recorded["seed"]["value"] == summary["seed"] != cfg.seed.value


def test_a_resume_keeps_the_seed_drawn_and_the_weights_it_started_from(tmp_path):
    # A fine-tuned run with seed=random, halted and resumed after its start file is gone: the
    # resume takes the checkpoint's seed and record of where the weights began, and loads none.
    start = tmp_path / "start.pt"
    model = build.model(compose_config(*tiny()), root_seed=5, num_classes=10)
    torch.save(model.state_dict(), start)
    run = tiny("seed=random", f"trainer.init_weights={start}")
    halted = train_in_process(tmp_path / "run", *run, "trainer.halt_at_step=3")
    start.unlink()
    resumed = train_in_process(tmp_path / "run", *run)
    assert resumed["seed"] == halted["seed"] and resumed["resumed_from_step"] == 3
    assert resumed["init_weights"] == halted["init_weights"]
    assert halted["init_weights"]["path"] == str(start)


def test_the_global_generators_are_seeded_from_the_runs_seed(tmp_path):
    train_in_process(tmp_path, *tiny("seed=3", "trainer.max_steps=1"))
    assert torch.initial_seed() == seeding.stream_seed(3, "torch", rank=0)


def test_an_attempt_failing_after_training_ends_at_the_step_it_reached(tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("the test split is gone")

    monkeypatch.setattr(run.final_test, "test_after_fit", broken)
    with pytest.raises(RuntimeError, match="test split is gone"):
        train_in_process(tmp_path, *tiny("trainer.max_steps=2"))
    (attempt,) = _attempts(tmp_path)
    assert attempt["end_step"] == 2 and attempt["result"] == "failed: the test split is gone"


def test_the_data_root_reaches_the_fingerprint_and_a_resumes_data_check(tmp_path, monkeypatch):
    roots, real = [], run.resume.check_same_data
    monkeypatch.setattr(
        run.resume, "check_same_data", lambda *args: roots.append(args[2]) or real(*args)
    )
    asked = tiny("data.root=/data/shapes")  # synthetic data reads no files: a root changes nothing
    train_in_process(tmp_path, *asked, "trainer.halt_at_step=3")
    resumed = train_in_process(tmp_path, *asked)
    assert roots == ["/data/shapes"] and resumed["resumed_from_step"] == 3


def test_the_summarys_data_fingerprint_is_of_the_files_under_the_data_root(tmp_path):
    from repro.core.data import fingerprint

    tree = make_image_tree(tmp_path / "images", per_class=4, side=36)
    asked = [*IMAGEFOLDER, f"data.root={tree}", "trainer.max_steps=1", "trainer.test_weights=last"]
    summary = train_in_process(tmp_path / "run", *asked)
    data = build.splits(compose_config(*asked), summary["seed"])
    assert summary["data"] == fingerprint.fingerprint(data, str(tree))
    assert summary["data"] != fingerprint.fingerprint(data, None), "paths relative to the root"


def test_in_a_projects_folder_the_engines_own_train_refuses_and_names_the_projects(
    tmp_path, monkeypatch
):
    from repro.core.runs import trust

    project = tmp_path / "lab"
    project.mkdir()
    monkeypatch.setattr(trust, "installed_projects", lambda: {"lab": project})
    with pytest.raises(UserError) as refused:
        train._refuse_a_projects_folder(["seed=3"], project)
    assert str(refused.value) == (
        "this folder is the project lab: train it with `python -m lab.train` "
        "(`python -m repro.train` trains the engine's own defaults, not its conf/)"
    )
    train._refuse_a_projects_folder([f"--config-path={project / 'conf'}"], project)  # asked
    train._refuse_a_projects_folder(["-cp", str(project / "conf")], project)
    train._refuse_a_projects_folder(["seed=3"], tmp_path)  # another folder: the engine's own
