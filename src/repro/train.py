"""Train an image classifier: `python -m repro.train [group=option] [key=value] ... [-m]`.

The command: Hydra composes the config (its errors as one line), `repro.core.run.train` trains
one run into its folder, a sweep's failed job is recorded and the sweep goes on, and the exit
status says how it ended. Nothing heavy is imported until a run starts.
"""

from __future__ import annotations

if __name__ == "__main__":  # before torch is imported, so the re-exec costs next to nothing
    from repro.core.runtime.launch import record_command, start

    start("repro.train")
    record_command("repro.train")

import logging
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from repro.core import composition, config
from repro.core.errors import StorageError, UserError, exit_with, one_line
from repro.core.files import write_text_atomic
from repro.core.guards import folders
from repro.core.runs import trust
from repro.core.runtime import launch
from repro.core.sweeps import ERROR_FILE
from repro.core.sweeps.callback import SweepReport
from repro.core.text import for_terminal

log = logging.getLogger("repro.train")
# Hydra's flags that show something and run nothing: the run's modules (torch with them) are
# never imported for them, so `--help` answers in well under a second.
SHOWS_ONLY = {
    "--help",
    "-h",
    "--hydra-help",
    "--cfg",
    "-c",
    "--info",
    "-i",
    "--version",
    "--shell-completion",
    "-sc",
}

config.register()


def _note_failure(run_dir: Path, error: Exception) -> None:
    """error.txt in a failed job's folder, for the sweep report (a full disk may refuse it)."""
    try:
        write_text_atomic(run_dir / ERROR_FILE, f"{type(error).__name__}: {one_line(error)}\n")
    except StorageError as refused:
        log.error("%s: the sweep report will not see why this job failed", refused)


def _as_user_error(error: Exception, run_dir: Path) -> Exception:
    """A file system that refused the run (full, read-only, over quota) is no bug: one line,
    saying that what is on disk is intact and the same command resumes."""
    if isinstance(error, OSError):  # one no write site turned into a StorageError
        error = StorageError(error.filename or run_dir, error, doing="use")
    if isinstance(error, StorageError):
        return UserError(
            f"{error}; the files written before are intact: free space (or fix the file "
            "system), then run the same command to resume"
        )
    return error


# conf/ ships inside the package (the top-level conf/ is a link to it), so an installed engine
# finds it too; a project passes its own --config-path and reaches this one by its search path.
@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    # Loaded already by `command_line`; here for a caller of `main` (the tests, a launcher).
    from repro.core import run
    from repro.core.runs import run_lock

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    in_sweep = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        summary = run.train(cfg, run_dir)
    except Exception as error:
        error = _as_user_error(error, run_dir)
        if not in_sweep:
            if isinstance(error, UserError):
                exit_with(error)
            raise
        # One job failing must not end the sweep: record why, let the launcher go on.
        said = for_terminal(one_line(error))  # to the console too: it may quote a file's values
        if isinstance(error, folders.UnsafeFolderError):  # its log may be a link out
            sys.stderr.write(f"error: job failed: {said}\n")
            return None
        log.error("job failed: %s", said, exc_info=not isinstance(error, UserError))
        if not isinstance(error, run_lock.RunFolderInUseError):  # the folder is another run's
            _note_failure(run_dir, error)
        return None
    finally:
        run_lock.release(run_dir)  # claimed when Hydra named the folder's record
    if summary.get("already_complete"):
        # Printed, not logged: the run's train.log stays as the finished run left it.
        print(
            f"already complete: {run_dir} holds all {summary['step']} steps of this config "
            f"({_scores(summary)}); nothing to do. To train longer, raise "
            "trainer.epochs or trainer.max_steps.",
            flush=True,
        )
        return _swept_value(summary)
    if summary["stopped_by_signal"] is not None and in_sweep:
        log.warning(
            "stopped by signal %d at step %d", summary["stopped_by_signal"], summary["step"]
        )
        return None
    if summary["stopped_by_signal"] is not None:
        signum = summary["stopped_by_signal"]
        log.warning(
            "stopped by signal %d at step %d, checkpoint saved; to resume, rerun the same "
            "command with hydra.run.dir=%s",
            signum,
            summary["step"],
            run_dir,
        )
        raise SystemExit(128 + signum)
    if not summary["completed"]:
        log.info("halted after step %d as asked (trainer.halt_at_step)", summary["step"])
        return None
    log.info(
        "done | %s | %.1f s | weights_sha256 %s | %s",
        _scores(summary),
        summary["wall_s"],
        summary["weights_sha256"][:16],
        run_dir,
    )
    return _swept_value(summary)


def _scores(summary: dict[str, Any]) -> str:
    """The last validation's accuracy and loss, or the test's when nothing validated."""
    prefix = "val" if "val_acc" in summary else "test"
    shown = [f"{prefix}_{name}" for name in ("acc", "loss") if f"{prefix}_{name}" in summary]
    return " ".join(f"{key} {summary[key]:.4f}" for key in shown) or "no evaluation"


def _swept_value(summary: dict[str, Any]) -> float | None:
    """What a hyperparameter sweeper optimises: val_acc (test_acc with no validation split)."""
    return summary.get("val_acc", summary.get("test_acc"))


def _refuse_a_projects_folder(argv: list[str], here: Path) -> None:
    """In a project's checkout, `python -m repro.train` would compose the engine's defaults,
    not the project's conf/: refuse, naming the project's own command (an explicit
    `--config-path` is the user's choice)."""
    if any(arg.startswith(("--config-path", "-cp")) for arg in argv):
        return
    for name, root in trust.installed_projects().items():
        if root == here.resolve():
            raise UserError(
                f"this folder is the project {name}: train it with `python -m {name}.train` "
                "(`python -m repro.train` trains the engine's own defaults, not its conf/)"
            )


def command_line() -> None:
    """The whole command once the hash seed is pinned: `seed=3` and torchrun's folder agreement,
    Hydra's composition (its errors as one line), the run or sweep, the exit status."""
    try:
        _refuse_a_projects_folder(sys.argv[1:], Path.cwd())
    except UserError as error:
        exit_with(error)
    sys.argv = launch.torchrun_argv(launch.expand_seed_shorthand(sys.argv))
    if not set(sys.argv[1:]) & SHOWS_ONLY:  # a run: its modules load before Hydra starts it
        from repro.core import run  # noqa: F401
    with composition.one_line_composition_errors():  # `objective.gama=3`: one line, not Hydra's
        main()
    from repro.core.runtime import distributed  # after Hydra: `--help` has exited already

    distributed.shutdown()
    distributed.leave(1 if SweepReport.failed_jobs else 0)
    if SweepReport.failed_jobs:
        raise SystemExit(1)


if __name__ == "__main__":
    command_line()
