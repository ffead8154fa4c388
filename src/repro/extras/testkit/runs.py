"""The kit's tiny runs: straight in this process, SIGKILLed and rerun, or on two processes.

A new interpreter costs several seconds on two cores (importing torch, Hydra and the
project), a tiny run about one. So the runs that need another process (one killed mid-run,
the ranks of a two-process run) are forks of this one, where everything is imported already:
a killed fork dies as `python -m repro.train` would, at the same point
(`REPRO_FAULT=step:N`, repro.core.runs.faults), and two forked ranks join a gloo process group
through the variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)
and run the same `repro.core.run.train`. Runs are kept by their composed config, so two checks
asking for the same run (the default objective's straight run is the default config's) share
it.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from repro.core.runs.fingerprint_log import FingerprintLog, Row

# What the engine writes into a run folder that legitimately differs between a straight run and
# a resumed one (the attempts made, times, the checkpoints' own records). Every other file is
# the run's result, the project's callbacks' files included, and must match to the byte.
ENGINE_RECORDS = (
    "attempts",
    "attempts.jsonl",
    "checkpoints",
    "metrics.csv",
    "summary.json",
    "resolved_config.yaml",
    ".hydra",
    "train.log",
    "tensorboard",
    "run.lock",
)
KILL_AFTER_STEP = 3  # one step past the checkpoint of step 2: a resume redoes step 3
FORK_LIMIT_S = 600.0  # a tiny run takes seconds: past this a fork is stuck, not slow


class RunFailedError(Exception):
    """A tiny run raised: `line` names the error and where in the project's code it came from;
    `trace` is the whole traceback (shown with pytest -v)."""

    def __init__(self, line: str, trace: str) -> None:
        super().__init__(f"{line}\n{trace}")
        self.line, self.trace = line, trace


def describe(error: BaseException, project: Path) -> str:
    """One line: the error, and the last frame of its traceback in the project's own files
    (else the last frame), as `path:line`."""
    frames = traceback.extract_tb(error.__traceback__)
    own = [frame for frame in frames if Path(frame.filename).is_relative_to(project)]
    where = (own or frames or [None])[-1]
    at = ""
    if where is not None:
        path = Path(where.filename)
        shown = path.relative_to(project) if path.is_relative_to(project) else path.name
        at = f" (at {shown}:{where.lineno})"
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {message}{at}"


def in_process(config: Any, run_dir: Path, project: Path) -> dict[str, Any]:
    """`repro.core.run.train` on `config` in `run_dir`; returns summary.json. Run again in the
    same folder, it resumes from the last checkpoint, as `make train` does."""
    from repro.core import run

    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        return run.train(config, run_dir)
    except Exception as error:  # the engine's one-line errors, a project's code raising
        raise RunFailedError(describe(error, project), traceback.format_exc()) from None


def forked(work: Callable[[], Any], env: dict[str, str], report: Path, project: Path) -> int:
    """Start `work()` in a fork of this process with `env` added; returns its pid. Its failure
    is written to `report` (line, then traceback) for `waited` to raise."""
    with warnings.catch_warnings():  # Python 3.12 warns on fork with threads (the child
        warnings.simplefilter("ignore", DeprecationWarning)  # touches none but its own)
        pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        import torch

        torch.set_num_threads(1)  # before any parallel region: see QUICK in project.py
        os.environ.update(env)
        work()
    except RunFailedError as error:
        code = 1
        report.write_text(f"{error.line}\n{error.trace}")
    except BaseException as error:
        code = 1
        report.write_text(f"{describe(error, project)}\n{traceback.format_exc()}")
    finally:
        os._exit(code)  # never back into pytest's own code


def waited(forks: list[tuple[int, Path]], limit: float = FORK_LIMIT_S) -> list[int]:
    """Each fork's exit status (negative: the signal that ended it), in order. When one raised,
    the others are stopped (a rank left alone would wait in a collective for gloo's half-hour
    timeout) and its error is raised; forks still running after `limit` seconds are stopped."""
    statuses: dict[int, int] = {}
    deadline = time.monotonic() + limit
    while len(statuses) < len(forks):
        for pid, report in forks:
            if pid in statuses:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                statuses[pid] = (
                    -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                )
                if report.is_file():
                    _stop(pid for pid, _ in forks if pid not in statuses)
                    line, _, trace = report.read_text().partition("\n")
                    raise RunFailedError(line, trace)
        if time.monotonic() > deadline:
            _stop(pid for pid, _ in forks if pid not in statuses)
            raise RunFailedError(f"the run did not finish within {limit:.0f} s (stopped)", "")
        time.sleep(0.05)
    return [statuses[pid] for pid, _ in forks]


def _stop(pids: Any) -> None:
    for pid in list(pids):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def killed(config: Any, run_dir: Path, project: Path, step: int = KILL_AFTER_STEP) -> None:
    """The run forked and SIGKILLed right after optimizer step `step`."""
    report = run_dir.with_name(f"{run_dir.name}.failed")
    work = lambda: in_process(config, run_dir, project)  # noqa: E731
    pid = forked(work, {"REPRO_FAULT": f"step:{step}"}, report, project)
    (status,) = waited([(pid, report)])
    if status != -signal.SIGKILL:
        raise RunFailedError(f"the run meant to be killed after step {step} exited {status}", "")


def on_processes(config: Any, run_dir: Path, project: Path, processes: int = 2) -> None:
    """The run on `processes` forked ranks of one gloo process group, as under torchrun."""
    with socket.socket() as probe:  # a free port for the group's store
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    ranks = []
    for rank in range(processes):
        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(processes),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "OMP_NUM_THREADS": "1",
        }
        report = run_dir.with_name(f"{run_dir.name}.rank{rank}.failed")
        work = lambda: in_process(config, run_dir, project)  # noqa: E731
        ranks.append((forked(work, env, report, project), report))
    statuses = waited(ranks)
    if any(statuses):
        raise RunFailedError(f"the run on {processes} processes exited {statuses}", "")


class Runs:
    """Tiny runs of composed configs, each made once: `straight`, `killed_and_rerun`,
    `on_two_processes` return the run's folder."""

    def __init__(self, project: Path, scratch: Path | None = None) -> None:
        self.project, self._scratch = project, scratch

    @property
    def scratch(self) -> Path:
        """Where the runs go: the folder given (pytest's), else a temporary one made on the
        first run, so that a Project only composing configs leaves nothing behind."""
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="repro-testkit-"))
        return self._scratch

    def _folder(self, config: Any, how: str) -> tuple[Path, bool]:
        """The folder of this config's run made `how`, and whether it is there already."""
        from omegaconf import OmegaConf

        text = OmegaConf.to_yaml(config, resolve=False)
        key = hashlib.sha256(f"{how}\n{text}".encode()).hexdigest()[:16]
        folder = self.scratch / f"{how}-{key}"
        return folder, (folder / "summary.json").is_file()

    def straight(self, config: Any) -> Path:
        folder, done = self._folder(config, "straight")
        if not done:
            in_process(config, folder, self.project)
        return folder

    def killed_and_rerun(self, config: Any) -> Path:
        folder, done = self._folder(config, "killed")
        if not done:
            killed(config, folder, self.project)
            in_process(config, folder, self.project)  # the same folder: resumes from step 2
        return folder

    def on_two_processes(self, config: Any) -> Path:
        folder, done = self._folder(config, "ranks")
        if not done:
            on_processes(config, folder, self.project)
        return folder


def steps(run_dir: Path) -> list[Row]:
    return FingerprintLog.of_run(run_dir).read()


def result_files(run_dir: Path) -> dict[str, str]:
    """{path: sha256} of the files a run folder holds beside the engine's own records."""
    found = {}
    for path in sorted(run_dir.rglob("*")):
        rel = path.relative_to(run_dir)
        if path.is_file() and rel.parts[0] not in ENGINE_RECORDS:
            found[rel.as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found
