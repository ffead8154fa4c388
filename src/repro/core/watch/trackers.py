"""Experiment trackers (`logger=mlflow`, `logger=wandb`, or both), fed by `MetricsLog`.

Each gets the resolved config flattened to dotted keys as its parameters when the run starts,
every step's training loss in one call per flush of the losses, every evaluation row as metrics
at its step, and at the end the summary's numbers and the run folder's records (summary.json,
metrics.csv, curves.png, resolved_config.yaml) as artifacts. Only rank 0 tracks. A resumed run
continues the tracker's run of the same folder (its id is kept in the folder), so rows after
the checkpoint it resumes from are logged again at the same steps. A job of a sweep is marked
as one: a W&B group named after the sweep folder, an MLflow run nested under the sweep's own.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from repro.core.errors import ConfigError, UserError, one_line
from repro.core.files import open_in_place, write_text_atomic
from repro.core.guards import received
from repro.core.schema import flatten
from repro.core.watch.loggers import STEP_LOSS

log = logging.getLogger(__name__)
ARTIFACTS = ("summary.json", "metrics.csv", "curves.png", "resolved_config.yaml")
DEFAULT_MLFLOW_STORE = Path("outputs") / "mlruns"  # under the working directory, ignored by git


def from_config(cfg: DictConfig, run_dir: Path) -> list[Any]:
    """The trackers `logger` asks for, started; one that cannot start is one UserError."""
    kinds = {"mlflow": MlflowTracker, "wandb": WandbTracker}
    wanted = [name for name in kinds if cfg.logger.get(name) is not None]
    sweep = sweep_of(cfg) if wanted else None
    return [_start(kinds[name], name, cfg, run_dir, sweep) for name in wanted]


@dataclass(frozen=True)
class Sweep:
    """The sweep a run is a job of: its folder, and what sets this job apart in it."""

    folder: Path
    tags: dict[str, str]  # the seed and each key the sweep varies -> this job's value


def sweep_of(cfg: DictConfig) -> Sweep | None:
    """The sweep of this process's Hydra job; None outside a multirun. The swept keys are the
    job's overrides but those the sweep's command line (its multirun.yaml) fixes."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    hydra, parse = HydraConfig.get(), OverridesParser.create().parse_overrides
    folder = Path(hydra.sweep.dir)
    recorded = folder / "multirun.yaml"  # written before the first job (not by every sweeper)
    given = _recorded_task(recorded, folder) if recorded.exists() else []
    fixed = {_text(o) for o in parse(given) if not o.is_sweep_override()}
    tags = {"seed": str(cfg.seed.value)}
    for override in parse(list(hydra.overrides.task)):
        if _text(override) not in fixed and override.key_or_group not in ("seed", "seed.value"):
            tags[override.key_or_group] = override.get_value_element_as_str()
    return Sweep(folder, tags)


def _recorded_task(record: Path, sweep_dir: Path) -> list[str]:
    """The sweep's command-line overrides from its multirun.yaml, read as data: a continued
    study may be someone else's, and OmegaConf would resolve what it holds."""
    found = received.load_yaml(record, root=sweep_dir)
    try:
        task = found["hydra"]["overrides"]["task"]
    except (KeyError, TypeError):
        task = None
    if not isinstance(task, list) or not all(isinstance(o, str) for o in task):
        raise UserError(f"{record}: not a sweep record (no list of hydra.overrides.task)")
    return task  # parsed by Hydra's override grammar, never resolved


def _text(override: Any) -> str:
    return f"{override.get_key_element()}={override.get_value_element_as_str()}"


def _start(kind: type, name: str, cfg: DictConfig, run_dir: Path, sweep: Sweep | None) -> Any:
    try:
        return kind(cfg, run_dir, sweep)
    except UserError:
        raise
    except Exception as error:  # a tracker's library fails in its own ways: a server, a store
        said = " ".join(one_line(error).split())  # its messages run over several lines
        said = said if len(said) <= 400 else said[:400] + " ..."
        raise UserError(
            f"logger={name}: the tracker could not start ({type(error).__name__}: {said})"
        ) from None


def mlflow_uri(setting: str | None) -> str:
    """`logger.mlflow.tracking_uri` as MLflow takes it: null is the local store under
    outputs/ (never the repository root), and a plain path is a local store there."""
    if not setting:
        return (Path.cwd() / DEFAULT_MLFLOW_STORE).as_uri()
    if "://" in setting or setting.startswith("file:"):
        return setting
    return Path(setting).expanduser().absolute().as_uri()


def _parameters(cfg: DictConfig) -> dict[str, Any]:
    values = flatten(OmegaConf.to_container(cfg, resolve=True))
    return {key: str(value) for key, value in values.items()}


def _numbers(summary: dict[str, Any]) -> dict[str, float]:
    return {
        key: float(value)
        for key, value in summary.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


def _kept_id(run_dir: Path, name: str) -> str | None:
    path = run_dir / name
    return received.read_text(path, root=run_dir).strip() if path.exists() else None


@contextlib.contextmanager
def _one_job_at_a_time(sweep: Sweep | None) -> Iterator[None]:
    """Within the block, no other job of `sweep` is in its own (a lock in the sweep folder,
    released when its file closes); outside a sweep, no lock."""
    if sweep is None:
        yield
        return
    with open_in_place(sweep.folder / ".mlflow_parent.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


class MlflowTracker:
    """MLflow: a local store in outputs/mlruns unless `logger.mlflow.tracking_uri` names
    another (a folder, a server, `sqlite:///...`). Every write is one `log_batch` request."""

    ID_FILE = ".mlflow_run_id"
    PARENT_FILE = ".mlflow_parent_run_id"  # in a sweep's folder: the run its jobs nest under

    def __init__(self, cfg: DictConfig, run_dir: Path, sweep: Sweep | None = None) -> None:
        settings = cfg.logger.mlflow
        self.run_dir, self.run_id = run_dir, _kept_id(run_dir, self.ID_FILE)
        # A sweep's jobs start together (the joblib launcher): one at a time makes its client
        # (a file store's first client writes the default experiment, which a second could
        # read half-written), then the experiment and the sweep's run.
        with _one_job_at_a_time(sweep):
            self.client = mlflow_client(settings.tracking_uri)
            if self.run_id is not None:
                return
            experiment_id, tags = self._experiment(settings.experiment), {}
            if sweep is not None:  # what `mlflow.start_run(nested=True)` sets
                parent = _kept_id(sweep.folder, self.PARENT_FILE)
                if parent is None:
                    made = self.client.create_run(experiment_id, run_name=sweep.folder.name)
                    parent = made.info.run_id
                    write_text_atomic(sweep.folder / self.PARENT_FILE, parent + "\n")
                tags = {"mlflow.parentRunId": parent} | sweep.tags
        run = self.client.create_run(experiment_id, run_name=run_dir.name, tags=tags)
        self.run_id = run.info.run_id
        write_text_atomic(run_dir / self.ID_FILE, self.run_id + "\n")
        from mlflow.entities import Param

        parameters = [Param(key, value[:6000]) for key, value in _parameters(cfg).items()]
        self.client.log_batch(self.run_id, params=parameters)

    def _experiment(self, name: str) -> str:
        """The id of the experiment `name`, made if missing. Another process may make it
        between our lookup and our creation; MLflow then refuses ours, and we use theirs."""
        from mlflow.exceptions import MlflowException

        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException as refused:
            experiment = self.client.get_experiment_by_name(name)
            if refused.error_code != "RESOURCE_ALREADY_EXISTS" or experiment is None:
                raise
            return experiment.experiment_id

    def _send(self, points: list[tuple[str, float, int]]) -> None:
        """(name, value, step) points, in one request."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(name, value, now, step) for name, value, step in points]
        self.client.log_batch(self.run_id, metrics=metrics)

    def metrics(self, row: dict[str, float], step: int) -> None:
        self._send([(k, v, step) for k, v in _numbers(row).items() if k not in ("epoch", "step")])

    def losses(self, first_step: int, values: list[float]) -> None:
        self._send([(STEP_LOSS, value, first_step + i) for i, value in enumerate(values)])

    def finish(self, summary: dict[str, Any]) -> None:
        self._send([(f"final/{k}", v, summary["step"]) for k, v in _numbers(summary).items()])
        for name in ARTIFACTS:
            if (self.run_dir / name).exists():
                self.client.log_artifact(self.run_id, str(self.run_dir / name))
        self.client.set_terminated(self.run_id)


def mlflow_client(tracking_uri: str | None) -> Any:
    """An MlflowClient of the store `logger.mlflow.tracking_uri` names."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise ConfigError("logger", "mlflow", "install the trackers extra first") from None
    uri = mlflow_uri(tracking_uri)
    if uri.startswith("file:"):
        # MLflow 3 keeps its file store but asks for this opt-in to use it.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    elif uri.startswith(("http:", "https:")):
        log.info(
            "logger=mlflow: starting a run at %s (MLflow retries a server that does not "
            "answer for minutes; MLFLOW_HTTP_REQUEST_MAX_RETRIES=1 gives up sooner)",
            uri,
        )
    return MlflowClient(tracking_uri=uri)


def end_sweep(cfg: DictConfig, folder: Path) -> None:
    """At a sweep's end: its report to its MLflow run, which is then finished (each resume of
    the sweep finishes it again)."""
    parent = _kept_id(folder, MlflowTracker.PARENT_FILE)
    if parent is None or cfg.logger.get("mlflow") is None:
        return
    client = mlflow_client(cfg.logger.mlflow.tracking_uri)
    for path in sorted(folder.glob("sweep*.*")):  # sweep_summary.{md,json,csv}, sweep.png
        client.log_artifact(parent, str(path))
    client.set_terminated(parent)


class WandbTracker:
    """Weights & Biases: offline (files under the run folder, `wandb sync` uploads them)
    unless `logger.wandb.mode=online` and an account is configured. A sweep's jobs share a
    group (the sweep folder's name), are tagged `key=value` with their seed and swept values,
    and have the swept values but the seed as their job type: W&B's grouping by job type
    then gathers each configuration's seeds."""

    ID_FILE = ".wandb_run_id"

    def __init__(self, cfg: DictConfig, run_dir: Path, sweep: Sweep | None = None) -> None:
        try:
            import wandb
        except ImportError:
            raise ConfigError("logger", "wandb", "install the trackers extra first") from None
        settings = cfg.logger.wandb
        self.run_dir, self.wandb = run_dir, wandb
        run_id = _kept_id(run_dir, self.ID_FILE)
        tags = [f"{key}={value}"[:64] for key, value in (sweep.tags if sweep else {}).items()]
        self.run = wandb.init(
            group=sweep.folder.name if sweep else None,
            tags=tags,
            job_type=" ".join(tags[1:])[:64] or None,  # W&B's limit for both: 64 characters
            project=settings.project,
            mode=settings.mode,
            dir=str(run_dir),
            id=run_id,
            resume="allow" if run_id else None,
            name=run_dir.name,
            config=_parameters(cfg),
        )
        if run_id is None:
            write_text_atomic(run_dir / self.ID_FILE, self.run.id + "\n")

    def metrics(self, row: dict[str, float], step: int) -> None:
        self.run.log({k: v for k, v in _numbers(row).items() if k != "step"}, step=step)

    def losses(self, first_step: int, values: list[float]) -> None:
        # One local message each to W&B's service process, which batches what it uploads.
        for offset, value in enumerate(values):
            self.run.log({STEP_LOSS: value}, step=first_step + offset)

    def finish(self, summary: dict[str, Any]) -> None:
        self.run.summary.update(_numbers(summary))
        for name in ARTIFACTS:
            if (self.run_dir / name).exists():
                self.run.save(str(self.run_dir / name), base_path=str(self.run_dir))
        self.run.finish()
        # W&B writes through a service process; `finish` can return before it has written
        # everything (the offline log once held only its header). This waits for it.
        self.wandb.teardown()
