"""What an entry point does before Hydra parses anything; imports nothing heavy.

- `start`: the working directory leaves sys.path, and PYTHONHASHSEED, read only when an
  interpreter starts, is pinned: unset, we set it and re-execute the entry point once (two
  interpreters in all); children inherit it.
- `seed=3` is shorthand for `seed.value=3` (seed is also a config group: fixed | random).
- The command the user typed is kept in the environment for the run records of every job.
- A run's time stamp and random id, shared by this process, its launcher workers and (through
  a broadcast) every torchrun rank, name one output folder that no other run can share.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import sys
import time
from pathlib import Path

DEFAULT_HASH_SEED = "0"
COMMAND_VARIABLE = "REPRO_COMMAND"
_SEED_GROUP_OPTIONS = {"fixed", "random"}
_SEED_ARG = re.compile(r"^seed=(.+)$")


def start(module: str, hash_seed: bool = True) -> None:
    """What `python -m module` does first, decided here alone: the working directory leaves
    sys.path (it was never looked in: see src/repro_safe_path.pth), and, where the command
    trains or rebuilds a run (`hash_seed`) and PYTHONHASHSEED is unset, the command starts
    once more with it set (Python reads it only at start-up): two interpreters at most."""
    if not sys.flags.safe_path:  # `-m` put the working directory first on sys.path
        here = _working_directory()
        if sys.path and here is not None and sys.path[0] == here:
            del sys.path[0]
        sys.path_importer_cache.pop(here, None)  # an entry named again later imports as usual
    if hash_seed and "PYTHONHASHSEED" not in os.environ:
        os.environ["PYTHONHASHSEED"] = DEFAULT_HASH_SEED
        os.execv(sys.executable, [sys.executable, "-P", "-m", module, *sys.argv[1:]])


def _working_directory() -> str | None:
    try:
        return str(Path.cwd())
    except OSError:  # removed under us: then nothing can be imported from it either
        return None


def record_command(module: str) -> None:
    """Keep the command the user typed, `python -m module ...`, for the run records. Launcher
    workers (joblib's, submitit's) inherit it: their own argv is the worker's, not the user's."""
    os.environ[COMMAND_VARIABLE] = shlex.join(["python", "-m", module, *sys.argv[1:]])


def expand_seed_shorthand(argv: list[str]) -> list[str]:
    """Rewrite `seed=<ints or a sweep of them>` to `seed.value=...`; leave group choices alone."""
    out = []
    for arg in argv:
        match = _SEED_ARG.match(arg)
        if match and not set(re.split(r"[,\s]+", match.group(1))) & _SEED_GROUP_OPTIONS:
            arg = f"seed.value={match.group(1)}"
        out.append(arg)
    return out


def _identity() -> tuple[str, str]:
    """(time stamp, random id) of this run, made once per process.

    Stored in the environment with the pid that made it, so that a child process (another run
    started from this one, or from a test) never reuses it. Launcher workers see the parent's
    values anyway: the resolvers are cached in the config that travels to them.
    """
    owner, _, rest = os.environ.get("REPRO_RUN", "").partition(":")
    stamp, _, token = rest.partition(":")
    if not token or owner != str(os.getpid()):
        stamp, token = time.strftime("%Y-%m-%d/%H-%M-%S"), secrets.token_hex(3)
        os.environ["REPRO_RUN"] = f"{os.getpid()}:{stamp}:{token}"
    return stamp, token


def run_id() -> str:
    """A short random id that keeps folders of runs started in the same second apart."""
    return _identity()[1]


def run_stamp() -> str:
    """The run's start time as date/time, fixed once per run (and shared by torchrun ranks)."""
    return _identity()[0]


def register_resolvers() -> None:
    """The resolvers of the run folder's name that conf/config.yaml names: `run_id` and
    `run_stamp` (repro.core.schema.register adds `record_subdir`)."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("run_id", run_id, replace=True, use_cache=True)
    OmegaConf.register_new_resolver("run_stamp", run_stamp, replace=True, use_cache=True)


def torchrun_argv(argv: list[str]) -> list[str]:
    """Under torchrun: one run folder for all ranks, and only rank 0 writes Hydra's files.

    Rank 0's time stamp and id are broadcast before Hydra names the folder, so every rank
    resolves the same path; the other ranks skip .hydra/ and log warnings to the console only.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return argv
    from repro.core.runtime import distributed

    context = distributed.from_environment()
    distributed.init(context, os.environ.get("REPRO_DIST_BACKEND", "auto"))
    stamp, token = distributed.broadcast(_identity(), context)
    os.environ["REPRO_RUN"] = f"{os.getpid()}:{stamp}:{token}"
    if context.is_main:
        return argv
    quiet = [
        "hydra.output_subdir=null",
        "hydra.job_logging.root.handlers=[console]",
        "hydra.job_logging.root.level=WARNING",
    ]
    return [*argv, *quiet]
