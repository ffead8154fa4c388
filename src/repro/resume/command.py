"""Finish what a run or a sweep left undone:
`python -m repro.resume PATH [force=true] [trust=true] [PLACE=VALUE ...]`.

A sweep folder (it holds Hydra's `multirun.yaml`): its jobs are Hydra's own expansion of the
recorded overrides (the basic sweeper's grid, numbered as Hydra numbered it), so a job that
never started is known too. The same multirun is launched again, into the same folder, with
the same launcher and hash seed, from the same working directory: a complete job answers
"already complete" and leaves its files as they were, a killed, stopped or failed one resumes
exactly from its last checkpoint (`trainer.resume=auto`), one never started starts; then the
sweep's report is written again. A run folder (`.hydra/hydra.yaml`): its last attempt's
overrides run again in it. `multirun.yaml` and `.hydra/` stay the first command's record.

Before anything runs, what each job recorded of its environment (every attempt's `env` in
attempts.jsonl, else summary.json's: library versions, lock hash, commit, CPU, device) and the
hash of its source.patch are compared with this checkout's; any difference is listed and the
resume refused (exit 2) unless `force=true`.

A sweep or run folder may come from someone else, so its records are data: the relaunch takes
from them only overrides `repro.core.overrides` lets through (values of the run's keys,
config-group options, the launcher's choice and job count; never a `_target_`, another Hydra
setting or an interpolation) and a hash seed that is one; the config is repro.train's own. It
runs in this process's working directory, never the recorded one, and imports nothing from it
(PYTHONSAFEPATH). Places (where data is read from, fetched from, cached or downloaded:
`overrides.PLACES`) are never a record's: the command line gives each one the record sets.
`trust=true` lifts the checks of overrides, places and config name.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from repro.core import overrides as recorded_overrides
from repro.core.errors import ConfigError, DataError, UserError, exit_with, one_line
from repro.core.files import write_text_atomic
from repro.core.guards import folders, received
from repro.core.runs import run_lock
from repro.core.runs.history import ATTEMPTS_FILE, RunHistory
from repro.core.sweeps import ERROR_FILE, render, report
from repro.core.text import for_terminal

USAGE = "python -m repro.resume PATH [force=true] [trust=true] [PLACE=VALUE ...]"
SWEEP_RECORD = "multirun.yaml"
COMPLETE = "complete"


class Job(NamedTuple):
    num: int  # Hydra's: the job's folder is named after it (hydra.sweep.subdir)
    overrides: list[str]
    folder: Path | None  # None: never started
    state: str  # COMPLETE, or why not


def job_state(folder: Path | None) -> str:
    """`complete`, or why not: never started, killed, failed: ..., stopped by signal N."""
    if folder is None:
        return "never started"
    if (folder / ERROR_FILE).is_file():
        return f"failed: {received.read_text(folder / ERROR_FILE, root=folder).strip()}"
    if _summary(folder).get("completed"):
        return COMPLETE
    attempts = RunHistory(folder).attempts()
    ended = attempts[-1]["result"] if attempts else "running"
    return "killed" if ended == "running" else ended  # a live run is refused before it runs


def _summary(folder: Path) -> dict[str, Any]:
    path = folder / "summary.json"
    present = path.exists() or path.is_symlink()
    found = received.load_json(path, root=folder) if present else {}
    return found if isinstance(found, dict) else {}


def _hydra_record(folder: Path, root: Path) -> dict[str, Any]:
    return received.load_yaml(folder / ".hydra" / "hydra.yaml", root=root)["hydra"]


def sweep_jobs(sweep_dir: Path, recorded: dict[str, Any], trusted: bool = False) -> list[Job]:
    """Every job of the sweep whose hydra config is `recorded`, numbered as Hydra numbers them:
    its overrides, as the basic sweeper expands the sweeper's `params` and the command line's,
    and its folder (found by the number Hydra recorded there) if it started."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    sweeper = recorded["sweeper"]
    if not sweeper["_target_"].endswith(".BasicSweeper"):
        raise DataError(
            f"{sweep_dir}: its sweeper is {sweeper['_target_']}, whose jobs depend on earlier "
            "results; resume re-expands only the basic sweeper's grid: run the search's command "
            "again (hydra/sweeper=optuna_study continues its study)"
        )
    params = [f"{key}={value}" for key, value in (sweeper.get("params") or {}).items()]
    recorded_overrides.check(params, sweep_dir / SWEEP_RECORD, trusted)  # before Hydra parses
    try:
        parsed = OverridesParser.create().parse_overrides([*params, *recorded["overrides"]["task"]])
        (grid,) = BasicSweeper.split_arguments(parsed, None)
    except HydraException as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DataError(f"{sweep_dir / SWEEP_RECORD}: cannot expand it: {reason}") from None
    started = {}
    for record in sweep_dir.glob("*/.hydra/hydra.yaml"):
        folder = record.parents[1]
        num = _hydra_record(folder, sweep_dir)["job"]["num"]
        if grid[num : num + 1] != [
            received.load_yaml(record.with_name("overrides.yaml"), sweep_dir)
        ]:
            raise DataError(f"{folder}: not job {num} of {SWEEP_RECORD} (another sweep went here)")
        started[num] = folder
    return [
        Job(num, overrides, started.get(num), job_state(started.get(num)))
        for num, overrides in enumerate(grid)
    ]


def _recorded_environment(folder: Path) -> dict[str, Any] | None:
    """What `folder`'s last attempt recorded of its environment (summary.json's for attempts
    made before attempts.jsonl held it), with its source patch's hash; None if nothing."""
    attempts = RunHistory(folder).attempts()
    last = attempts[-1] if attempts else {}
    env = last.get("env") or _summary(folder).get("env") or {}
    if not last and not env:
        return None
    patch = folder / (last.get("source_patch") or "-")
    patch_text = received.read_text(patch, "table", root=folder) if patch.is_file() else None
    commit = last.get("git_commit", env.get("git_commit"))
    return {**env, "git_commit": commit, "source_patch_sha256": _digest(patch_text)}


def _digest(text: str | None) -> str | None:
    return hashlib.sha256(text.encode()).hexdigest()[:16] if text else None


def environment_changes(run_dirs: list[Path]) -> list[str]:
    """Each difference between what the folders recorded and this checkout, once."""
    import torch

    from repro.core.runtime import environment
    from repro.core.runtime.devices import select_device
    from repro.verify.command import environment_changes as changes

    described: dict[str, dict[str, Any]] = {}  # device type -> this machine's description
    lines: dict[str, None] = {}
    for recorded in filter(None, map(_recorded_environment, run_dirs)):
        try:
            device = select_device(recorded.get("device", "cpu"))
        except ConfigError:  # a CUDA run, and no GPU here: the device differs
            device = torch.device("cpu")
        if device.type not in described:
            described[device.type] = environment.describe(device)
            described[device.type]["source_patch_sha256"] = _digest(environment.source_patch())
        # The relaunch uses the recorded hash seed, and its launcher divides the threads again.
        now = described[device.type] | {
            k: recorded.get(k) for k in ("pythonhashseed", "num_threads")
        }
        lines |= dict.fromkeys(changes(recorded, {k: v for k, v in now.items() if k in recorded}))
    return list(lines)


def _before_running(path: Path, recorded: list[Path], unfinished: list[Path], force: bool) -> None:
    """Refuse (one line) a changed environment unless `force`, listing what changed first;
    then, with the run lock's message, a folder a live process trains in. The lock is taken
    and let go: a dead owner's run.lock goes, as the next run there would remove it."""
    from repro.core.runtime import distributed

    changes = environment_changes(recorded)
    for line in changes:
        print(for_terminal(f"  {line}"), file=sys.stderr)
    if changes and not force:
        raise UserError(
            f"{path}: the code or environment differs from the one its runs recorded "
            f"({len(changes)} differences, listed above): resuming would mix the two; to "
            "resume anyway, add force=true"
        )
    for folder in unfinished:
        with run_lock.owned(folder, distributed.from_environment()):
            pass


def _relaunch(recorded: dict[str, Any], folder: str, run: recorded_overrides.Relaunch) -> int:
    """`python -m repro.train` into the same output folder (`folder`: `hydra.run.dir=...` or
    `hydra.sweep.dir=...`) with the checked `run`, in this process's working directory, with
    the recorded hash seed; its output goes straight to ours. Returns its exit status, as a
    shell would."""
    child_env = dict(os.environ, PYTHONSAFEPATH="1")  # nothing imported from the folder we run in
    if run.hash_seed is not None:
        child_env["PYTHONHASHSEED"] = run.hash_seed
    started_in = recorded.get("runtime", {}).get("cwd")
    if started_in and Path(str(started_in)) != Path.cwd():
        shown = for_terminal(repr(str(started_in)))
        print(
            f"note: it was started in {shown}; relative paths now resolve from here, {Path.cwd()}"
        )
    mode = ["--multirun"] if recorded["mode"] == "MULTIRUN" else []
    # The folder last: an override after it would win (trusted records keep theirs too).
    arguments = [*mode, f"--config-name={run.config_name}", *run.hydra, *run.task, folder]
    shown = for_terminal(shlex.join(["python", "-m", "repro.train", *arguments]))
    print(f"running: {shown}", flush=True)
    command = [sys.executable, "-m", "repro.train", *arguments]
    done = subprocess.run(command, env=child_env, check=False)
    return done.returncode if done.returncode >= 0 else 128 - done.returncode


def resume_sweep(
    sweep_dir: Path, force: bool, trusted: bool = False, places: dict[str, str] | None = None
) -> int:
    folders.check_sweep(sweep_dir)  # before error.txt goes, the report or multirun.yaml
    places = places or {}
    record = sweep_dir / SWEEP_RECORD
    first_record = received.read_text(record, root=sweep_dir)
    recorded = received.parse_yaml(first_record, record)["hydra"]
    with_records = sorted(p.parent for p in sweep_dir.glob("*/attempts.jsonl"))
    env = next(filter(None, map(_recorded_environment, with_records)), None)
    relaunch = recorded_overrides.checked_relaunch(
        recorded, recorded["overrides"]["task"], env, record, trusted
    )
    relaunch = recorded_overrides.with_places(relaunch, places, record, trusted)
    jobs = sweep_jobs(sweep_dir, recorded, trusted)
    for job in jobs:  # the sweeper's params expanded too: each job is a command line
        recorded_overrides.check(job.overrides, record, trusted)
        recorded_overrides.placed(job.overrides, places, record, trusted)
    first = recorded_overrides.placed(jobs[0].overrides, places, record, True) if jobs else []
    composed = recorded_overrides.check_composes(relaunch, first, record)
    recorded_overrides.check_network(composed, places, record, trusted)
    todo = [job for job in jobs if job.state != COMPLETE]
    if not todo:
        render.write(report.build(sweep_dir))
        print(f"complete: all {len(jobs)} jobs of {sweep_dir} are done; report rewritten")
        return 0
    started = [job.folder for job in todo if job.folder is not None]
    _before_running(sweep_dir, with_records, started, force)
    shared = set.intersection(*(set(job.overrides) for job in jobs))
    print(f"{sweep_dir}: {len(jobs) - len(todo)} of {len(jobs)} jobs complete; to run:")
    for job in todo:
        own = " ".join(o for o in job.overrides if o not in shared)
        print(for_terminal(f"  job {job.num} ({job.state}): {own}"))
    for folder in started:  # its line is in its train.log too; a new failure writes it again
        (folder / ERROR_FILE).unlink(missing_ok=True)
    returncode = _relaunch(recorded, f"hydra.sweep.dir={sweep_dir.absolute()}", relaunch)
    write_text_atomic(record, first_record)  # Hydra wrote the relaunch's over the sweep's own
    if returncode != 0:  # the multirun did not get to write the report
        render.write(report.build(sweep_dir))
    return returncode


def resume_run(
    run_dir: Path, force: bool, trusted: bool = False, places: dict[str, str] | None = None
) -> int:
    folders.check(run_dir)
    places = places or {}
    recorded = _hydra_record(run_dir, run_dir)
    if recorded["mode"] == "MULTIRUN":
        raise DataError(
            f"{run_dir} is job {recorded['job']['num']!r} of a sweep: resume the sweep, which "
            f"runs it with the sweep's launcher (python -m repro.resume {run_dir.parent})"
        )
    summary = _summary(run_dir)
    if summary.get("completed"):
        print(f"complete: {run_dir} holds all {summary.get('step')!r} steps; nothing to do")
        return 0
    attempts = RunHistory(run_dir).attempts()  # the last one's overrides: an extension's too
    task = attempts[-1]["overrides"] if attempts else recorded["overrides"]["task"]
    source = run_dir / (ATTEMPTS_FILE if attempts else ".hydra/hydra.yaml")
    env = _recorded_environment(run_dir)
    relaunch = recorded_overrides.checked_relaunch(recorded, task, env, source, trusted)
    relaunch = recorded_overrides.with_places(relaunch, places, source, trusted)
    composed = recorded_overrides.check_composes(relaunch, relaunch.task, source)
    recorded_overrides.check_network(composed, places, source, trusted)
    _before_running(run_dir, [run_dir], [run_dir], force)
    return _relaunch(recorded, f"hydra.run.dir={run_dir.absolute()}", relaunch)


# What a record holds when it is damaged or not one of ours: read as data, they end in one line.
_MALFORMED = (KeyError, IndexError, TypeError, ValueError, AttributeError, yaml.YAMLError, OSError)


def main(argv: list[str]) -> None:
    try:
        if not argv or "=" in argv[0]:
            raise ConfigError("PATH", None, f"usage: {USAGE}")
        path, switches, places = Path(argv[0]), {"force": False, "trust": False}, {}
        for arg in argv[1:]:
            key, _, value = arg.partition("=")
            if key in recorded_overrides.PLACES:
                places[key] = value
            elif key not in switches or value not in ("true", "false"):
                where = ", ".join(recorded_overrides.PLACES)
                raise ConfigError(key, value, f"{USAGE}; a PLACE is one of {where}")
            else:
                switches[key] = value == "true"
        try:
            if (path / SWEEP_RECORD).is_file():
                returncode = resume_sweep(path, switches["force"], switches["trust"], places)
            elif (path / ".hydra" / "hydra.yaml").is_file():
                returncode = resume_run(path, switches["force"], switches["trust"], places)
            else:
                raise DataError(
                    f"{path}: neither a sweep folder (no {SWEEP_RECORD}) nor a run folder (no "
                    ".hydra/hydra.yaml)"
                )
        except _MALFORMED as error:
            reason = (one_line(error).strip().splitlines() or [type(error).__name__])[0]
            raise DataError(f"{path}: its records are damaged or not repro's ({reason})") from None
    except UserError as error:
        exit_with(error)
    raise SystemExit(returncode)
