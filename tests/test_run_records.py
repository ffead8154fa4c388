"""A run folder's record never lies: its first .hydra/ stays, every attempt is recorded, a
finished run is not rewritten and a resume under another seed is refused."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from repro.core.runs.history import DIED

from conftest import read_summary, run_cli, tiny


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (hidden ones too) and a hash of its bytes."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def attempts(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished one-epoch run in its own folder, and the command that made it."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    command = [*tiny("trainer.checkpoint_every_steps=2"), f"hydra.run.dir={run_dir}"]
    done = run_cli("repro.train", *command)
    assert done.returncode == 0, done.stderr
    return run_dir, command


@pytest.mark.e2e
@pytest.mark.slow
def test_rerunning_a_finished_run_changes_no_file(finished):
    run_dir, command = finished
    before = snapshot(run_dir)
    done = run_cli("repro.train", *command)
    assert done.returncode == 0, done.stderr
    assert "already complete" in done.stdout
    assert snapshot(run_dir) == before


@pytest.mark.e2e
def test_a_resume_under_another_seed_is_refused_naming_both(finished):
    run_dir, command = finished
    before = snapshot(run_dir)
    done = run_cli("repro.train", *command, "seed=5")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "seed=5" in done.stderr and "seed=0" in done.stderr
    after = snapshot(run_dir)
    assert after.pop("train.log") != before.pop("train.log")  # the refusal is logged there
    assert after == before


@pytest.mark.e2e
@pytest.mark.slow
def test_a_shorter_config_is_refused(finished):
    _, command = finished
    done = run_cli("repro.train", *command, "trainer.max_steps=2")
    assert done.returncode == 2 and "cannot be shortened" in done.stderr
    assert "6 steps" in done.stderr and "asks for 2" in done.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_an_extension_keeps_the_first_record_and_adds_its_own(tmp_path):
    run_dir = tmp_path / "run"
    command = [*tiny(), f"hydra.run.dir={run_dir}"]
    assert run_cli("repro.train", *command).returncode == 0
    first_hydra = snapshot(run_dir / ".hydra")
    done = run_cli("repro.train", *command, "trainer.epochs=2")
    assert done.returncode == 0, done.stderr

    assert snapshot(run_dir / ".hydra") == first_hydra
    first, second = attempts(run_dir)
    assert (first["attempt"], first["config"], first["start_step"], first["end_step"]) == (
        1, ".hydra", 0, 6,
    )  # fmt: skip
    assert first["result"] == second["result"] == "completed"
    assert (second["config"], second["start_step"], second["end_step"]) == ("attempts/2", 6, 12)
    assert second["command"].endswith("trainer.epochs=2")
    assert "trainer.epochs=2" in yaml.safe_load((run_dir / "attempts/2/overrides.yaml").read_text())
    assert (
        yaml.safe_load((run_dir / "attempts/2/config.yaml").read_text())["trainer"]["epochs"] == 2
    )
    assert read_summary(run_dir)["step"] == 12


@pytest.mark.e2e
@pytest.mark.slow
def test_a_refused_first_try_leaves_hydra_to_the_first_attempt_that_trains(tmp_path):
    run_dir = tmp_path / "run"
    assert (
        run_cli("repro.train", *tiny("optimizer.lr=-1"), f"hydra.run.dir={run_dir}").returncode == 2
    )
    assert not (run_dir / "attempts.jsonl").exists()
    assert run_cli("repro.train", *tiny(), f"hydra.run.dir={run_dir}").returncode == 0
    overrides = yaml.safe_load((run_dir / ".hydra/overrides.yaml").read_text())
    assert "optimizer.lr=-1" not in overrides
    assert [a["config"] for a in attempts(run_dir)] == [".hydra"]


@pytest.mark.e2e
@pytest.mark.slow
def test_a_killed_attempt_is_marked_died_by_the_resume_which_is_recorded(tmp_path):
    run_dir = tmp_path / "run"
    command = [*tiny("trainer.checkpoint_every_steps=2"), f"hydra.run.dir={run_dir}"]
    killed = run_cli("repro.train", *command, env={"REPRO_FAULT": "step:3"})
    assert killed.returncode != 0
    assert [a["result"] for a in attempts(run_dir)] == ["running"]  # all SIGKILL leaves
    assert run_cli("repro.train", *command).returncode == 0
    first, second = attempts(run_dir)
    assert first["result"] == DIED and second["result"] == "completed"
    assert second["start_step"] == 2
    assert second["resumed_from"] == "checkpoints/last.pt"
    assert second["skipped_checkpoints"] == [] and first["resumed_from"] is None


# ---- the unit: attempts.jsonl and the first record (fast, in-process) ----------------------


@pytest.fixture
def recorded(monkeypatch):
    """A history whose commit, source patch and command line are fixed by the test."""
    from repro.core.runs import history

    monkeypatch.setattr(history.environment, "git_commit", lambda: "c0ffee")
    monkeypatch.setattr(history.environment, "source_patch", lambda: None)
    monkeypatch.setenv(history.COMMAND_VARIABLE, "python -m repro.train seed=3")
    monkeypatch.setattr(history, "_task_overrides", lambda: ["seed=3"])
    return history


def test_each_attempt_is_a_line_and_the_first_hydra_record_is_kept(recorded, tmp_path):
    from omegaconf import OmegaConf

    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text("seed: 3\n")
    cfg = OmegaConf.create({"seed": 3})
    first = recorded.RunHistory(run_dir)
    assert first.attempts() == []
    first.begin(cfg, 0, {"resumed_from": None}, {"python": "3.11"})
    reserve = run_dir / recorded.RESERVE_FILE
    assert reserve.stat().st_size == recorded.RESERVE_BYTES  # room to record the end
    (line,) = first.attempts()
    started = line.pop("started")
    assert len(started) == len("2026-11-26T08:49:42+0000") and started[10] == "T"
    assert line == {
        "attempt": 1, "command": "python -m repro.train seed=3", "overrides": ["seed=3"],
        "config": ".hydra", "git_commit": "c0ffee", "env": {"python": "3.11"},
        "source_patch": None, "start_step": 0, "resumed_from": None, "end_step": None,
        "result": "running",
    }  # fmt: skip
    assert not (run_dir / "attempts").exists()
    assert (run_dir / recorded.ATTEMPTS_FILE).read_text().startswith('{"attempt": 1, "command"')
    # Killed outright: the next attempt finds it running, marks it died, records its own.
    recorded.environment.source_patch = lambda: "diff --git a/x b/x\n"
    second = recorded.RunHistory(run_dir)
    second.begin(OmegaConf.create({"seed": 3, "more": 1}), 4, {}, {})
    second.end("completed", 9)
    assert not reserve.exists()
    was, now = second.attempts()
    assert was["result"] == recorded.DIED and was["end_step"] is None
    assert (now["attempt"], now["config"], now["start_step"]) == (2, "attempts/2", 4)
    assert (now["result"], now["end_step"]) == ("completed", 9)
    assert now["source_patch"] == "attempts/2/source.patch"
    folder = run_dir / "attempts" / "2"
    assert (folder / "source.patch").read_text() == "diff --git a/x b/x\n"
    assert OmegaConf.load(folder / "config.yaml") == {"seed": 3, "more": 1}
    assert OmegaConf.load(folder / "overrides.yaml") == ["seed=3"]
    assert (run_dir / ".hydra" / "config.yaml").read_text() == "seed: 3\n"


def test_a_first_attempt_without_hydras_record_writes_its_own_and_its_patch_at_the_top(
    recorded, tmp_path
):
    from omegaconf import OmegaConf

    recorded.environment.source_patch = lambda: "patch\n"
    history = recorded.RunHistory(tmp_path)
    history.begin(OmegaConf.create({"a": 1}), 0, {}, {})
    (line,) = history.attempts()
    assert (line["config"], line["source_patch"]) == ("attempts/1", "source.patch")
    assert (tmp_path / "source.patch").read_text() == "patch\n"
    assert (tmp_path / "attempts" / "1" / "config.yaml").is_file()


@pytest.mark.parametrize(
    ("error", "result"),
    [(RuntimeError("cuda out of memory"), "failed: cuda out of memory"),
     (KeyError(), "failed: KeyError")],
)  # fmt: skip
def test_a_failed_attempt_names_its_error_in_one_line(recorded, tmp_path, error, result):
    from omegaconf import OmegaConf

    history = recorded.RunHistory(tmp_path)
    history.begin(OmegaConf.create({}), 0, {}, {})
    history.fail(error, 5)
    (line,) = history.attempts()
    assert (line["result"], line["end_step"]) == (result, 5)


def test_a_refused_failure_record_is_a_warning_not_a_second_error(
    recorded, tmp_path, monkeypatch, caplog
):
    from omegaconf import OmegaConf

    from repro.core.errors import StorageError

    history = recorded.RunHistory(tmp_path)
    history.begin(OmegaConf.create({}), 0, {}, {})

    def full(path, text):
        raise StorageError(path, OSError(28, "No space left on device"))

    monkeypatch.setattr(recorded, "write_text_atomic", full)
    history.fail(RuntimeError("boom"), 2)  # no exception: the caller raises `boom`
    (warning,) = [r for r in caplog.records if r.name == "repro.core.runs.history"]
    assert warning.getMessage().endswith(": the attempt's line still says running")
    assert "No space left on device" in warning.getMessage()


def test_hydra_writes_its_record_only_into_a_folder_no_attempt_trained_in(recorded, tmp_path):
    from repro.core.runs import run_lock

    fresh = tmp_path / "fresh"
    assert recorded.record_subdir(str(fresh)) == ".hydra"
    run_lock.release(fresh)
    trained = tmp_path / "trained"
    trained.mkdir()
    (trained / recorded.ATTEMPTS_FILE).write_text("")
    assert recorded.record_subdir(str(trained)) is None
    run_lock.release(trained)
    unsafe = tmp_path / "unsafe"
    unsafe.mkdir()
    (unsafe / "run.lock").symlink_to(tmp_path / "elsewhere")  # a claim would write out of it
    assert recorded.record_subdir(str(unsafe)) is None  # training refuses it in one line
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize(
    ("summary", "checkpoint_step", "complete"),
    [({"completed": True, "step": 10}, 10, True), ({"completed": False, "step": 10}, 10, False),
     ({"completed": True, "step": 8}, 10, False), ({"completed": True, "step": 10}, 8, False),
     ({"step": 10}, 10, False), (None, 10, False)],
)  # fmt: skip
def test_a_folder_is_complete_only_with_a_completed_summary_of_exactly_the_steps(
    tmp_path, summary, checkpoint_step, complete
):
    from repro.core.runs.history import already_complete

    if summary is not None:
        (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert already_complete(tmp_path, checkpoint_step, 10) is complete


def test_an_output_folder_that_cannot_be_written_is_one_line_naming_the_key(tmp_path, capsys):
    from repro.core.runs.history import check_writable

    check_writable(tmp_path / "new" / "deep", "hydra.run.dir")  # made, probed, left empty
    assert list((tmp_path / "new" / "deep").iterdir()) == []
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as stopped:
        check_writable(tmp_path / "file" / "run", "hydra.sweep.dir")
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        f"error: cannot write the output folder {tmp_path / 'file' / 'run'} (Not a directory): "
        "set hydra.sweep.dir to one you can\n"
    )
    (tmp_path / "new" / "metrics.csv").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SystemExit):
        check_writable(tmp_path / "new", "hydra.run.dir")
    assert capsys.readouterr().err.startswith(
        f"error: {tmp_path / 'new'}: metrics.csv is a link to "
    )


def test_the_command_line_recorded_is_the_typed_one_else_this_processs(monkeypatch):
    import sys
    from types import SimpleNamespace

    from repro.core.runs import history

    monkeypatch.setenv(history.COMMAND_VARIABLE, "python -m repro.train -m seed=0,1")
    assert history._command_line() == "python -m repro.train -m seed=0,1"
    monkeypatch.delenv(history.COMMAND_VARIABLE)
    monkeypatch.setattr(sys, "argv", ["/somewhere/train.py", "seed=1", "data.root=a b"])
    main = SimpleNamespace(__spec__=SimpleNamespace(name="repro.train"))
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert history._command_line() == "python -m repro.train seed=1 'data.root=a b'"
    main.__spec__ = None  # run as a script
    assert history._command_line() == "train.py seed=1 'data.root=a b'"
    main.__spec__ = SimpleNamespace(name="")
    assert history._command_line() == "train.py seed=1 'data.root=a b'"
    assert history._task_overrides() == []  # outside Hydra: none


def test_hydras_callback_checks_the_run_and_sweep_folders_before_it_writes(tmp_path, capsys):
    from omegaconf import OmegaConf

    from repro.core.runs.history import OutputFolderCheck

    check = OutputFolderCheck()
    config = OmegaConf.create({"hydra": {"run": {"dir": str(tmp_path / "run")},
                                         "sweep": {"dir": str(tmp_path / "sweep")}}})  # fmt: skip
    check.on_run_start(config)
    check.on_multirun_start(config)
    assert (tmp_path / "run").is_dir() and (tmp_path / "sweep").is_dir()
    (tmp_path / "file").write_text("")
    bad = OmegaConf.create({"hydra": {"run": {"dir": str(tmp_path / "file" / "r")},
                                      "sweep": {"dir": str(tmp_path / "file" / "s")}}})  # fmt: skip
    for start, key in (
        (check.on_run_start, "hydra.run.dir"),
        (check.on_multirun_start, "hydra.sweep.dir"),
    ):
        with pytest.raises(SystemExit):
            start(bad)
        assert capsys.readouterr().err.endswith(f"(Not a directory): set {key} to one you can\n")
    (tmp_path / "sweep" / "0").mkdir()
    (tmp_path / "sweep" / "0" / "run.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SystemExit):  # a sweep's job folder that links out
        check.on_multirun_start(config)
    assert "run.lock is a link to" in capsys.readouterr().err


def test_a_disk_too_full_for_the_reserve_still_records_the_attempt_and_its_end(
    recorded, tmp_path, monkeypatch
):
    import errno

    from omegaconf import OmegaConf

    history = recorded.RunHistory(tmp_path)
    (tmp_path / "attempts" / "1").mkdir(parents=True)  # left by an attempt killed before its line
    real_open = recorded.open_in_place

    class Full:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *_):
            self.handle.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    def full(path: Path, mode: str = "a"):
        handle = real_open(path, mode)  # made, then the disk is full
        return Full(handle) if path.name == recorded.RESERVE_FILE else handle

    monkeypatch.setattr(recorded, "open_in_place", full)
    history.begin(OmegaConf.create({"a": 1}), 0, {}, {})
    assert not (tmp_path / recorded.RESERVE_FILE).exists()
    history.end("completed", 3)
    (line,) = history.attempts()
    assert (line["config"], line["result"], line["end_step"]) == ("attempts/1", "completed", 3)


def test_an_existing_output_folder_passes_and_an_error_without_words_is_named_by_type(
    tmp_path, capsys
):
    from repro.core.runs import history

    history.check_writable(tmp_path, "hydra.run.dir")
    history.check_writable(tmp_path, "hydra.run.dir")  # again: it exists already
    assert list(tmp_path.iterdir()) == []

    def wordless(folder):
        raise OSError()

    with pytest.raises(SystemExit):
        history.check_writable(tmp_path / "x", "hydra.run.dir", guard=wordless)
    assert capsys.readouterr().err == (
        f"error: cannot write the output folder {tmp_path / 'x'} (OSError): set hydra.run.dir "
        "to one you can\n"
    )


def test_hydra_writes_its_record_where_the_folder_cannot_even_be_claimed(tmp_path):
    from repro.core.runs import history

    (tmp_path / "file").write_text("")
    assert history.record_subdir(str(tmp_path / "file" / "run")) == ".hydra"  # training refuses
