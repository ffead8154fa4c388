"""`python -m repro.resume PATH`: a killed sweep or run finished exactly, complete jobs left
byte for byte as they were, a changed environment refused unless forced, wrong paths one line."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repro.core.errors import UserError
from repro.resume import command as resume

from conftest import TINY, read_summary, run_cli, train_in_process

# Tiny runs with a checkpoint every other step; one thread, as a joblib job of a sweep gets.
BASE = [o for o in TINY if not o.startswith("trainer.epochs=")] + [
    "trainer.num_threads=1",
    "trainer.checkpoint_every_steps=2",
]
# Jobs 0 and 1 train 6 steps, jobs 2 and 3 twelve, one after another in the sweep's process
# (n_jobs=1): a SIGKILL after step 9 ends the sweep with jobs 0 and 1 done, job 2 killed after
# its step-8 checkpoint, job 3 never started.
KILL_JOB_2 = {"REPRO_FAULT": "step:9"}


def file_hashes(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def attempts(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]


def edit_recorded_env(run_dir: Path, key: str, value: str) -> None:
    """Pretend the folder's last attempt ran elsewhere: `key` of its recorded environment."""
    lines = attempts(run_dir)
    lines[-1]["env"][key] = value
    (run_dir / "attempts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in lines))


def resume_in_process(*args: str) -> int:
    with pytest.raises(SystemExit) as done:
        resume.main([*args])
    return done.value.code


@pytest.mark.e2e
@pytest.mark.slow
def test_a_killed_sweep_is_finished_exactly_and_its_complete_jobs_are_untouched(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    command = ["-m", "trainer.epochs=1,2", "seed=0,1", "hydra/launcher=joblib",
               "hydra.launcher.n_jobs=1", *BASE, f"hydra.sweep.dir={sweep}"]  # fmt: skip
    killed = run_cli("repro.train", *command, env=KILL_JOB_2)
    assert killed.returncode == -9, killed.stderr
    assert [read_summary(sweep / str(n))["completed"] for n in (0, 1)] == [True, True]
    assert not (sweep / "2" / "summary.json").exists()
    assert (sweep / "2" / "checkpoints" / "last.pt").exists() and not (sweep / "3").exists()
    complete = {n: file_hashes(sweep / str(n)) for n in (0, 1)}

    # A changed environment (here: job 2's recorded torch) is listed, and nothing runs.
    copy = tmp_path / "copy"
    shutil.copytree(sweep, copy)
    edit_recorded_env(copy / "2", "torch", "0.0.0-recorded")
    before = file_hashes(copy)
    assert resume_in_process(str(copy)) == 2
    err = capsys.readouterr().err
    assert "torch: '0.0.0-recorded' recorded" in err
    (error,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert "force=true" in error
    assert file_hashes(copy) == before

    done = run_cli("repro.resume", str(sweep))
    assert done.returncode == 0, done.stderr
    assert "job 2 (killed)" in done.stdout and "job 3 (never started)" in done.stdout
    assert {n: file_hashes(sweep / str(n)) for n in (0, 1)} == complete
    (first, second) = attempts(sweep / "2")
    assert first["result"].startswith("died") and second["resumed_from"] == "checkpoints/last.pt"
    assert second["start_step"] == 8 and second["result"] == "completed"

    jobs = json.loads((sweep / "sweep_summary.json").read_text())["jobs"]
    assert [job["status"] for job in jobs] == ["ok"] * 4
    straight = tmp_path / "straight"  # the same sweep, never interrupted
    command[-1] = f"hydra.sweep.dir={straight}"
    assert run_cli("repro.train", *command).returncode == 0
    for number, job in enumerate(jobs):
        assert job["weights_sha256"] == read_summary(straight / str(number))["weights_sha256"]

    assert resume_in_process(str(sweep)) == 0
    assert "complete: all 4 jobs" in capsys.readouterr().out


@pytest.mark.e2e
@pytest.mark.slow
def test_a_killed_run_resumes_from_its_checkpoint_once_a_changed_environment_is_forced(
    tmp_path, capsys
):
    run_dir = tmp_path / "run"
    run = [*BASE, "trainer.epochs=1"]
    killed = run_cli("repro.train", *run, f"hydra.run.dir={run_dir}", env={"REPRO_FAULT": "step:3"})
    assert killed.returncode == -9, killed.stderr
    edit_recorded_env(run_dir, "uv_lock_sha256", "0" * 64)
    assert resume_in_process(str(run_dir)) == 2
    assert f"uv_lock_sha256: '{'0' * 64}' recorded" in capsys.readouterr().err

    assert resume_in_process(str(run_dir), "force=true") == 0  # the training's exit status
    assert attempts(run_dir)[-1]["start_step"] == 2
    alone = train_in_process(tmp_path / "alone", *run)
    assert read_summary(run_dir)["weights_sha256"] == alone["weights_sha256"]
    assert resume_in_process(str(run_dir)) == 0
    assert "complete: " in capsys.readouterr().out


def hydra_record(folder: Path, mode: str) -> Path:
    """A run folder's .hydra/hydra.yaml as Hydra writes it, reduced to what resume reads."""
    (folder / ".hydra").mkdir(parents=True)
    record = {"mode": mode, "job": {"num": 2}, "overrides": {"hydra": [], "task": []}}
    (folder / ".hydra" / "hydra.yaml").write_text(json.dumps({"hydra": record}))
    return folder


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda tmp: tmp / "missing", "neither a sweep folder"),
        (lambda tmp: tmp, "neither a sweep folder"),
        (lambda tmp: hydra_record(tmp / "sweep" / "2", "MULTIRUN"), "is job 2 of a sweep"),
    ],
)
def test_a_folder_that_is_no_run_or_a_sweeps_job_gets_one_line(tmp_path, capsys, make, expected):
    assert resume_in_process(str(make(tmp_path))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err


def test_a_wrong_option_gets_one_line(tmp_path, capsys):
    assert resume_in_process(str(tmp_path), "force=yes") == 2
    assert capsys.readouterr().err.startswith("error: force='yes' is not allowed")


def test_a_folder_a_live_run_owns_is_refused_with_the_lock_message(tmp_path, capsys):
    run_dir = hydra_record(tmp_path / "run", "RUN")
    holder = (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        'os.write(fd, b\'{"pid": 1, "host": "elsewhere", "since": "now"}\')\n'
        "print('locked', flush=True)\n"
        "time.sleep(60)\n"
    )
    lock = str(run_dir / "run.lock")
    owner = subprocess.Popen(
        [sys.executable, "-c", holder, lock], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout.readline().strip() == "locked"
        assert resume_in_process(str(run_dir)) == 2
    finally:
        owner.kill()
        owner.wait()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "in use by a live run (pid 1 on elsewhere" in err


# ---- the unit: a job's state from its folder (fast, in-process) ----------------------------


def _job_folder(tmp_path: Path, summary: dict | None, results: list[str], error: str = "") -> Path:
    folder = tmp_path / "job"
    folder.mkdir()
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    lines = [json.dumps({"attempt": n + 1, "result": r}) for n, r in enumerate(results)]
    if lines:
        (folder / "attempts.jsonl").write_text("\n".join(lines) + "\n")
    if error:
        (folder / "error.txt").write_text(error + "\n")
    return folder


JOB_STATES = {
    "finished": ({"completed": True, "step": 6}, ["completed"], "", "complete"),
    "stopped by SIGTERM": (
        {"completed": False, "step": 3, "stopped_by_signal": 15},
        ["stopped by signal 15"], "", "stopped by signal 15",
    ),
    "a summary without the flag": ({"step": 3}, ["halted"], "", "halted"),
    "killed outright": (None, ["running"], "", "killed"),
    "killed before its first record": (None, [], "", "killed"),
    "failed": (None, ["failed: boom"], "ValueError: boom", "failed: ValueError: boom"),
}  # fmt: skip


@pytest.mark.parametrize("case", JOB_STATES)
def test_a_jobs_state_is_complete_only_when_its_summary_says_completed(case, tmp_path):
    summary, results, error, expected = JOB_STATES[case]
    assert resume.job_state(_job_folder(tmp_path, summary, results, error)) == expected
    assert resume.job_state(None) == "never started"


# ---- the unit: the relaunch's command line, environment and exit status --------------------


@pytest.mark.parametrize(("mode", "code", "returned"), [("MULTIRUN", 0, 0), ("RUN", -9, 137),
                                                        ("RUN", 3, 3)])  # fmt: skip
def test_the_relaunch_runs_repro_train_with_the_checked_arguments_in_this_folder(
    tmp_path, monkeypatch, capsys, mode, code, returned
):
    from types import SimpleNamespace

    from repro.core.overrides import Relaunch

    ran = []

    def run(command, env, check):
        ran.append((command, env, check))
        return SimpleNamespace(returncode=code)

    monkeypatch.setattr(resume.subprocess, "run", run)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    recorded = {"mode": mode, "runtime": {"cwd": "/where/it/ran"}}
    relaunch = Relaunch("train", ["hydra/launcher=joblib"], ["seed=1", "amp=off"], "7")
    assert resume._relaunch(recorded, "hydra.sweep.dir=/s", relaunch) == returned
    ((command, env, check),) = ran
    multirun = ["--multirun"] if mode == "MULTIRUN" else []
    arguments = [*multirun, "--config-name=train", "hydra/launcher=joblib", "seed=1", "amp=off",
                 "hydra.sweep.dir=/s"]  # fmt: skip
    assert command == [sys.executable, "-m", "repro.train", *arguments] and check is False
    assert env["PYTHONSAFEPATH"] == "1" and env["PYTHONHASHSEED"] == "7"
    assert capsys.readouterr().out == (
        f"note: it was started in '/where/it/ran'; relative paths now resolve from here, "
        f"{tmp_path}\nrunning: python -m repro.train {' '.join(arguments)}\n"
    )
    ran.clear()
    here = {"mode": mode, "runtime": {"cwd": str(tmp_path)}}
    resume._relaunch(here, "hydra.run.dir=/r", relaunch._replace(hash_seed=None))
    assert "PYTHONHASHSEED" not in ran[0][1]
    assert capsys.readouterr().out.startswith("running: ")  # started here: no note


RESUME_USAGE = "python -m repro.resume PATH [force=true] [trust=true] [PLACE=VALUE ...]"
A_PLACE = "a PLACE is one of data.root, data.endpoint_url, data.cache_dir, data.download"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], f"PATH=None is not allowed: usage: {RESUME_USAGE}"),
        (["force=true"], f"PATH=None is not allowed: usage: {RESUME_USAGE}"),
        (["{d}", "force"], f"force='' is not allowed: {RESUME_USAGE}; {A_PLACE}"),
        (["{d}", "overwrite=true"], f"overwrite='true' is not allowed: {RESUME_USAGE}; {A_PLACE}"),
        (["{d}", "trust=1"], f"trust='1' is not allowed: {RESUME_USAGE}; {A_PLACE}"),
        (["{d}", "seed.value=3"], f"seed.value='3' is not allowed: {RESUME_USAGE}; {A_PLACE}"),
        (
            ["{d}"],
            "{d}: neither a sweep folder (no multirun.yaml) nor a run folder (no .hydra/hydra.yaml)",
        ),
    ],
)
def test_the_commands_mistakes_are_one_line_word_for_word(tmp_path, capsys, argv, message):
    assert resume_in_process(*(a.format(d=tmp_path) for a in argv)) == 2
    assert capsys.readouterr().err == f"error: {message.format(d=tmp_path)}\n"


def test_a_damaged_record_is_one_line_naming_the_folder(tmp_path, capsys):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "hydra.yaml").write_text("hydra: [1]\n")  # a list, not a mapping
    assert resume_in_process(str(tmp_path), "force=false", "trust=false") == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path}: its records are damaged or not repro's (list indices must be "
        "integers or slices, not str)\n"
    )
    (tmp_path / ".hydra" / "hydra.yaml").write_text("hydra: {mode: RUN}\n")
    assert resume_in_process(str(tmp_path)) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path}: its records are damaged or not repro's ('overrides')\n"
    )


# ---- resume_run and resume_sweep in-process, the relaunch replaced by a recording -----------


def hydra_config(folder: Path, mode: str = "RUN", num: int = 0, task=()) -> dict:
    """What Hydra records of a run or a sweep's job, reduced to what resume reads."""
    return {"mode": mode, "job": {"num": num, "config_name": "config"},
            "overrides": {"hydra": [], "task": list(task)}, "runtime": {"cwd": str(folder)}}  # fmt: skip


def recorded_run(folder: Path, mode: str = "RUN", num: int = 0, task=()) -> dict:
    record = hydra_config(folder, mode, num, task)
    (folder / ".hydra").mkdir(parents=True, exist_ok=True)
    (folder / ".hydra" / "hydra.yaml").write_text(json.dumps({"hydra": record}))
    (folder / ".hydra" / "overrides.yaml").write_text(json.dumps(list(task)))
    return record


@pytest.fixture
def relaunched(monkeypatch):
    calls = []

    def relaunch(recorded, folder, run):
        calls.append((recorded["mode"], folder, run))
        return 0

    monkeypatch.setattr(resume, "_relaunch", relaunch)
    return calls


def test_a_halted_run_is_relaunched_into_its_folder_and_a_complete_one_is_left(
    tmp_path, relaunched, capsys
):
    run_dir = tmp_path / "run"
    train_in_process(run_dir, *BASE, "trainer.epochs=1", "trainer.halt_at_step=2")
    recorded_run(run_dir, task=["seed=0"])
    assert resume.job_state(run_dir) == "halted"
    assert resume.resume_run(run_dir, force=False) == 0
    ((mode, folder, run),) = relaunched
    assert (mode, folder) == ("RUN", f"hydra.run.dir={run_dir.absolute()}")
    assert run.config_name == "config" and run.task == []  # the last attempt's overrides
    assert not (run_dir / "run.lock").exists()  # taken and let go before the relaunch
    done = tmp_path / "done"
    train_in_process(done, *BASE, "trainer.epochs=1")
    recorded_run(done)
    assert resume.resume_run(done, force=False) == 0 and len(relaunched) == 1
    steps = json.loads((done / "summary.json").read_text())["step"]
    assert capsys.readouterr().out.endswith(
        f"complete: {done} holds all {steps} steps; nothing to do\n"
    )


def test_a_run_recorded_elsewhere_is_refused_listing_the_differences_unless_forced(
    tmp_path, relaunched, capsys
):
    run_dir = tmp_path / "run"
    train_in_process(run_dir, *BASE, "trainer.epochs=1", "trainer.halt_at_step=2")
    recorded_run(run_dir)
    edit_recorded_env(run_dir, "torch", "0.1.0")
    with pytest.raises(UserError) as refused:
        resume.resume_run(run_dir, force=False)
    assert str(refused.value) == (
        f"{run_dir}: the code or environment differs from the one its runs recorded (1 "
        "differences, listed above): resuming would mix the two; to resume anyway, add force=true"
    )
    listed = capsys.readouterr().err
    assert listed.startswith("  ") and "torch" in listed and "0.1.0" in listed
    assert relaunched == []
    assert resume.resume_run(run_dir, force=True) == 0 and len(relaunched) == 1


def test_a_sweeps_unfinished_jobs_are_listed_relaunched_and_its_record_kept(
    tmp_path, relaunched, capsys
):
    sweep = tmp_path / "sweep"
    record = recorded_run(sweep / "0", "MULTIRUN", 0, ["seed.value=0"])  # a finished job
    train_in_process(sweep / "0", *BASE, "trainer.epochs=1", "seed.value=0")
    recorded_run(sweep / "1", "MULTIRUN", 1, ["seed.value=1"])  # a failed job
    train_in_process(
        sweep / "1", *BASE, "trainer.epochs=1", "trainer.halt_at_step=1", "seed.value=1"
    )
    (sweep / "1" / "error.txt").write_text("ValueError: lr\n")
    sweeper = {
        "_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
        "params": None,
    }
    multirun = {
        "hydra": {
            **record,
            "sweeper": sweeper,
            "overrides": {"hydra": [], "task": ["seed.value=0,1,2"]},
        }
    }
    (sweep / "multirun.yaml").write_text(json.dumps(multirun))
    jobs = resume.sweep_jobs(sweep, multirun["hydra"])
    assert [(j.num, j.overrides, j.state) for j in jobs] == [
        (0, ["seed.value=0"], "complete"), (1, ["seed.value=1"], "failed: ValueError: lr"),
        (2, ["seed.value=2"], "never started"),
    ]  # fmt: skip
    assert resume.resume_sweep(sweep, force=False) == 0
    out = capsys.readouterr().out
    assert (
        f"{sweep}: 1 of 3 jobs complete; to run:\n  job 1 (failed: ValueError: lr): seed.value=1\n"
        in out
    )
    assert "  job 2 (never started): seed.value=2\n" in out
    ((mode, folder, run),) = relaunched
    assert (mode, folder) == ("MULTIRUN", f"hydra.sweep.dir={sweep.absolute()}")
    assert run.task == ["seed.value=0,1,2"] and not (sweep / "1" / "error.txt").exists()
    assert json.loads((sweep / "multirun.yaml").read_text()) == multirun


# ---- the unit: what a folder recorded of its environment, against this checkout ---------------


def record_attempts(folder: Path, *records: dict, summary: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if records:
        (folder / "attempts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def short_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def test_the_recorded_environment_is_the_last_attempts_with_its_commit_and_patch(tmp_path):
    run = record_attempts(
        tmp_path / "run",
        {"env": {"torch": "0.1"}, "git_commit": "first"},
        {"env": {"torch": "2.0", "git_commit": "env's"}, "git_commit": "abc", "source_patch": "p"},
        summary={"env": {"torch": "summary's"}},
    )  # fmt: skip
    (run / "p").write_text("a patch\n")
    assert resume._recorded_environment(run) == {
        "torch": "2.0", "git_commit": "abc", "source_patch_sha256": short_digest("a patch\n"),
    }  # fmt: skip
    # An attempt without the commit: the environment's; a patch named but gone: no digest.
    (run / "p").unlink()
    record_attempts(run, {"env": {"torch": "2.0", "git_commit": "env's"}, "source_patch": "p"})
    assert resume._recorded_environment(run) == {
        "torch": "2.0", "git_commit": "env's", "source_patch_sha256": None,
    }  # fmt: skip


def test_an_attempt_without_an_environment_takes_the_summarys_and_no_record_is_none(tmp_path):
    older = record_attempts(
        tmp_path / "older", {"git_commit": "abc"}, summary={"env": {"torch": "1.0"}}
    )
    assert resume._recorded_environment(older) == {
        "torch": "1.0", "git_commit": "abc", "source_patch_sha256": None,
    }  # fmt: skip
    bare = record_attempts(tmp_path / "bare", {"git_commit": "abc"})
    assert resume._recorded_environment(bare) == {"git_commit": "abc", "source_patch_sha256": None}
    only_summary = record_attempts(tmp_path / "summary", summary={"env": {"git_commit": "s"}})
    assert resume._recorded_environment(only_summary) == {
        "git_commit": "s", "source_patch_sha256": None,
    }  # fmt: skip
    assert resume._recorded_environment(record_attempts(tmp_path / "empty")) is None
    assert resume._digest("") is None and resume._digest("x") == short_digest("x")


def test_environment_changes_list_each_difference_from_this_checkout_once(tmp_path, monkeypatch):
    from repro.core.runtime import environment

    # A checkout with local changes: the recorded patch is compared with this one.
    monkeypatch.setattr(environment, "source_patch", lambda *_: "local changes")
    now = environment.describe(torch.device("cpu"))
    same = {"git_commit": now["git_commit"], "source_patch": "p"}
    # No device recorded (an older run): the CPU. The hash seed and thread count are the
    # relaunch's own, never a difference.
    first = record_attempts(
        tmp_path / "first",
        {"env": {"python": "0.0", "pythonhashseed": "12345", "num_threads": 77}, **same},
    )  # fmt: skip
    (first / "p").write_text("local changes")
    # A CUDA run, with no GPU here: compared with this CPU; another patch.
    second = record_attempts(
        tmp_path / "second", {"env": {"device": "cuda", "python": "0.0"}, **same}
    )
    (second / "p").write_text("other changes")
    python = f"python: '0.0' recorded, {now['python']!r} now"
    assert resume.environment_changes([first]) == [python]
    assert resume.environment_changes([first, second]) == [
        python,
        "device: 'cuda' recorded, 'cpu' now (changes floating-point results)",
        f"source_patch_sha256: {short_digest('other changes')!r} recorded, "
        f"{short_digest('local changes')!r} now",
    ]


# ---- the unit: a sweep's jobs, re-expanded from its record ------------------------------------

BASIC = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def sweep_record(params: dict | None = None, task=(), target: str = BASIC) -> dict:
    return {"sweeper": {"_target_": target, "params": params}, "overrides": {"task": list(task)}}


def test_a_sweeps_jobs_are_its_sweepers_params_crossed_with_its_command_line(tmp_path):
    jobs = resume.sweep_jobs(tmp_path, sweep_record({"seed.value": "0,1"}, ["trainer.epochs=3"]))
    assert [(j.num, j.overrides, j.folder, j.state) for j in jobs] == [
        (0, ["seed.value=0", "trainer.epochs=3"], None, "never started"),
        (1, ["seed.value=1", "trainer.epochs=3"], None, "never started"),
    ]


def test_a_sweep_record_that_cannot_be_resumed_is_one_line_saying_why(tmp_path):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from repro.core.errors import DataError
    from repro.core.runs.trust import UntrustedConfigError

    record = tmp_path / "multirun.yaml"
    optuna = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    with pytest.raises(DataError) as refused:
        resume.sweep_jobs(tmp_path, sweep_record(target=optuna))
    assert str(refused.value) == (
        f"{tmp_path}: its sweeper is {optuna}, whose jobs depend on earlier results; resume "
        "re-expands only the basic sweeper's grid: run the search's command again "
        "(hydra/sweeper=optuna_study continues its study)"
    )
    # The sweeper's own params are checked as the command line's are, naming the record.
    code = sweep_record({"model._target_": "os.system"})
    with pytest.raises(UntrustedConfigError) as refused:
        resume.sweep_jobs(tmp_path, code)
    assert str(refused.value).startswith(
        f"{record}: the recorded override 'model._target_=os.system' is refused"
    )
    assert [j.overrides for j in resume.sweep_jobs(tmp_path, code, trusted=True)] == [
        ["model._target_=os.system"]
    ]
    with pytest.raises(HydraException) as parsing:
        OverridesParser.create().parse_overrides(["seed.value=[1,"])
    with pytest.raises(DataError) as refused:
        resume.sweep_jobs(tmp_path, sweep_record(task=["seed.value=[1,"]))
    reason = str(parsing.value).strip().splitlines()[0]
    assert str(refused.value) == f"{record}: cannot expand it: {reason}"
    # A folder of another sweep, numbered as one of this sweep's jobs.
    recorded_run(tmp_path / "0", "MULTIRUN", 0, ["seed.value=7"])
    with pytest.raises(DataError) as refused:
        resume.sweep_jobs(tmp_path, sweep_record({"seed.value": "0,1"}))
    assert str(refused.value) == (
        f"{tmp_path / '0'}: not job 0 of multirun.yaml (another sweep went here)"
    )


def fake_sweep(sweep: Path, task: list[str], started: dict[int, bool], params=None) -> list:
    """A sweep folder as Hydra and repro leave it, without training: multirun.yaml, and for each
    started job (its number: whether it completed) its Hydra record, summary and attempts,
    the first recording the hash seed 42. Returns the sweep's jobs."""
    sweep.mkdir(parents=True)
    hydra = {**hydra_config(sweep, "MULTIRUN"), "sweeper": {"_target_": BASIC, "params": params}}
    hydra["overrides"] = {"hydra": [], "task": task}
    (sweep / "multirun.yaml").write_text(json.dumps({"hydra": hydra}))
    jobs = resume.sweep_jobs(sweep, hydra, trusted=True)
    for num, completed in started.items():
        folder = sweep / str(num)
        recorded_run(folder, "MULTIRUN", num, jobs[num].overrides)
        scores = dict.fromkeys(("val_acc", "val_loss", "test_acc", "test_loss"), 0.5)
        (folder / "summary.json").write_text(json.dumps({"completed": completed, **scores}))
        result = "completed" if completed else "stopped"
        record_attempts(folder, {"env": {"pythonhashseed": "42"}, "result": result})
    return jobs


def test_a_sweep_is_refused_on_a_changed_environment_then_relaunched_with_its_hash_seed(
    tmp_path, relaunched, capsys
):
    sweep = tmp_path / "sweep"
    # 0 complete, 1 stopped without an error.txt, 2 and 3 never started; two keys vary.
    jobs = fake_sweep(sweep, ["seed.value=0,1", "trainer.epochs=1,2"], {0: True, 1: False})
    with pytest.raises(UserError) as refused:  # the records name no commit: this one differs
        resume.resume_sweep(sweep, force=False)
    assert str(refused.value).startswith(
        f"{sweep}: the code or environment differs from the one its runs recorded ("
    )
    assert relaunched == []
    assert resume.resume_sweep(sweep, force=True) == 0
    out = capsys.readouterr().out
    assert f"{sweep}: 1 of 4 jobs complete; to run:\n" in out
    for job in jobs[1:]:
        state = "stopped" if job.num == 1 else "never started"
        assert f"  job {job.num} ({state}): {' '.join(job.overrides)}\n" in out
    ((_, _, run),) = relaunched
    assert run.hash_seed == "42" and run.task == ["seed.value=0,1", "trainer.epochs=1,2"]
    # The multirun writes the report; resume writes it only when the multirun failed.
    assert not (sweep / "sweep_summary.json").exists()


def test_a_failed_relaunch_or_a_finished_sweep_gets_its_report_written(
    tmp_path, monkeypatch, capsys
):
    sweep = tmp_path / "sweep"
    fake_sweep(sweep, ["seed.value=0,1"], {0: True, 1: True})
    assert resume.resume_sweep(sweep, force=True) == 0
    assert (
        capsys.readouterr().out == f"complete: all 2 jobs of {sweep} are done; report rewritten\n"
    )
    assert json.loads((sweep / "sweep_summary.json").read_text())["sweep_dir"] == str(sweep)
    (sweep / "sweep_summary.json").unlink()
    (sweep / "1" / "summary.json").write_text(json.dumps({"completed": False}))
    monkeypatch.setattr(resume, "_relaunch", lambda *_: 3)
    assert resume.resume_sweep(sweep, force=True) == 3
    assert (sweep / "sweep_summary.json").is_file()


def test_a_sweeps_params_that_name_code_run_only_when_trusted(tmp_path, relaunched):
    from repro.core.runs.trust import UntrustedConfigError

    sweep = tmp_path / "sweep"
    params = {"+model.note._target_": "os.getcwd"}
    fake_sweep(sweep, ["seed.value=0"], {}, params=params)
    with pytest.raises(UntrustedConfigError) as refused:
        resume.resume_sweep(sweep, force=True)
    assert str(refused.value).startswith(f"{sweep / 'multirun.yaml'}: the recorded override")
    assert relaunched == []
    assert resume.resume_sweep(sweep, force=True, trusted=True) == 0 and len(relaunched) == 1
    # The same on the command line the sweep recorded.
    by_task = tmp_path / "by_task"
    fake_sweep(by_task, ["+model.note._target_=os.getcwd"], {})
    with pytest.raises(UntrustedConfigError) as refused:
        resume.resume_sweep(by_task, force=True)
    assert str(refused.value).startswith(f"{by_task / 'multirun.yaml'}: the recorded override")
    assert resume.resume_sweep(by_task, force=True, trusted=True) == 0 and len(relaunched) == 2


def test_a_sweep_whose_first_job_does_not_compose_is_one_line(tmp_path, relaunched):
    from repro.core.errors import DataError

    sweep = tmp_path / "sweep"
    fake_sweep(sweep, ["model=no_such_model,small_cnn"], {})
    with pytest.raises(DataError) as refused:
        resume.resume_sweep(sweep, force=True)
    assert str(refused.value).startswith(
        f"{sweep / 'multirun.yaml'}: its overrides do not compose in this checkout: "
    )
    assert "no_such_model" in str(refused.value) and relaunched == []


@pytest.mark.parametrize(
    ("switches", "force", "trust", "places"),
    [
        ([], False, False, {}),
        (["force=true"], True, False, {}),
        (["trust=true", "force=false"], False, True, {}),
        (
            ["data.root=/here", "data.download=false"],
            False,
            False,
            {"data.root": "/here", "data.download": "false"},
        ),
    ],
)
def test_the_commands_switches_reach_the_run_or_sweep_it_resumes(
    tmp_path, monkeypatch, switches, force, trust, places
):
    calls = []

    def recorder(kind: str, code: int):
        def resumed(path, force, trusted, given):
            return calls.append((kind, path, force, trusted, given)) or code

        return resumed

    monkeypatch.setattr(resume, "resume_run", recorder("run", 5))
    monkeypatch.setattr(resume, "resume_sweep", recorder("sweep", 6))
    run, sweep = hydra_record(tmp_path / "run", "RUN"), tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("")
    assert resume_in_process(str(run), *switches) == 5  # the resume's exit status
    assert resume_in_process(str(sweep), *switches) == 6
    assert calls == [("run", run, force, trust, places), ("sweep", sweep, force, trust, places)]


def test_a_record_failing_without_a_message_is_named_by_its_error(tmp_path, monkeypatch, capsys):
    def unreadable(*_):
        raise KeyError()

    monkeypatch.setattr(resume, "resume_run", unreadable)
    run = hydra_record(tmp_path / "run", "RUN")
    assert resume_in_process(str(run)) == 2
    assert capsys.readouterr().err == (
        f"error: {run}: its records are damaged or not repro's (KeyError)\n"
    )


def test_a_runs_record_is_checked_naming_the_file_it_came_from(tmp_path, relaunched):
    from repro.core.errors import DataError
    from repro.core.runs.trust import UntrustedConfigError

    # No attempts.jsonl (an older run): the command line Hydra recorded.
    old = tmp_path / "old"
    recorded_run(old, task=["+model.note._target_=os.getcwd"])
    with pytest.raises(UntrustedConfigError) as refused:
        resume.resume_run(old, force=True)
    assert str(refused.value).startswith(f"{old / '.hydra/hydra.yaml'}: the recorded override")
    assert resume.resume_run(old, force=True, trusted=True) == 0 and len(relaunched) == 1
    # The last attempt's overrides, which an extension may have changed.
    run = tmp_path / "run"
    recorded_run(run, task=["seed.value=1"])
    record_attempts(run, {"overrides": ["model=no_such_model"], "result": "stopped"})
    with pytest.raises(DataError) as refused:
        resume.resume_run(run, force=True)
    assert str(refused.value).startswith(
        f"{run / 'attempts.jsonl'}: its overrides do not compose in this checkout: "
    )
    assert len(relaunched) == 1


def test_the_relaunch_keeps_this_environment_and_flushes_its_line_before_the_child_runs(
    monkeypatch,
):
    import io

    from repro.core.overrides import Relaunch

    class Recording(io.StringIO):
        flushed = ""

        def flush(self):
            self.flushed = self.getvalue()

    out, seen = Recording(), []

    def run(command, env, check):
        seen.append((out.flushed, env))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(resume.subprocess, "run", run)
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setenv("REPRO_KEPT", "yes")
    recorded = {"mode": "RUN"}  # no runtime record: nothing to say about where it started
    assert resume._relaunch(recorded, "hydra.run.dir=/r", Relaunch("config", [], [], None)) == 0
    ((flushed, env),) = seen
    assert flushed == "running: python -m repro.train --config-name=config hydra.run.dir=/r\n"
    assert env["REPRO_KEPT"] == "yes" and env["PYTHONSAFEPATH"] == "1"
