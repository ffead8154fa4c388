"""Experiment trackers (`logger=mlflow`, `logger=wandb`), fed by `MetricsLog`.

Each gets the resolved config flattened to dotted keys as its parameters when the run starts,
every evaluation row as metrics at its step, and at the end the summary's numbers and the run
folder's records (summary.json, metrics.csv, curves.png, resolved_config.yaml) as artifacts.
Only rank 0 tracks. A resumed run continues the tracker's run of the same folder (its id is
kept in the folder), so rows after the checkpoint it resumes from are logged again at the
same steps.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from repro.config import flatten
from repro.errors import ConfigError, UserError, one_line
from repro.files import write_text_atomic

log = logging.getLogger(__name__)
ARTIFACTS = ("summary.json", "metrics.csv", "curves.png", "resolved_config.yaml")
DEFAULT_MLFLOW_STORE = Path("outputs") / "mlruns"  # under the working directory, ignored by git


def from_config(cfg: DictConfig, run_dir: Path) -> list[Any]:
    """The trackers `logger` asks for, started; one that cannot start is one UserError."""
    kinds = {"mlflow": MlflowTracker, "wandb": WandbTracker}
    wanted = [name for name in kinds if cfg.logger.get(name) is not None]
    return [_start(kinds[name], name, cfg, run_dir) for name in wanted]


def _start(kind: type, name: str, cfg: DictConfig, run_dir: Path) -> Any:
    try:
        return kind(cfg, run_dir)
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
    return path.read_text().strip() if path.exists() else None


class MlflowTracker:
    """MLflow: a local store in outputs/mlruns unless `logger.mlflow.tracking_uri` names
    another (a folder, a server, `sqlite:///...`)."""

    ID_FILE = ".mlflow_run_id"

    def __init__(self, cfg: DictConfig, run_dir: Path) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise ConfigError("logger", "mlflow", "install the trackers extra first") from None
        settings = cfg.logger.mlflow
        uri = mlflow_uri(settings.tracking_uri)
        if uri.startswith("file:"):
            # MLflow 3 keeps its file store but asks for this opt-in to use it.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        elif uri.startswith(("http:", "https:")):
            log.info(
                "logger=mlflow: starting a run at %s (MLflow retries a server that does not "
                "answer for minutes; MLFLOW_HTTP_REQUEST_MAX_RETRIES=1 gives up sooner)",
                uri,
            )
        self.client, self.run_dir = MlflowClient(tracking_uri=uri), run_dir
        self.run_id = _kept_id(run_dir, self.ID_FILE)
        if self.run_id is None:
            experiment = self.client.get_experiment_by_name(settings.experiment)
            experiment_id = (
                experiment.experiment_id
                if experiment is not None
                else self.client.create_experiment(settings.experiment)
            )
            run = self.client.create_run(experiment_id, run_name=run_dir.name)
            self.run_id = run.info.run_id
            write_text_atomic(run_dir / self.ID_FILE, self.run_id + "\n")
            for key, value in _parameters(cfg).items():
                self.client.log_param(self.run_id, key, value[:6000])
        self.tracking_uri = uri

    def metrics(self, row: dict[str, float], step: int) -> None:
        for key, value in _numbers(row).items():
            if key not in ("epoch", "step"):
                self.client.log_metric(self.run_id, key, value, step=step)

    def finish(self, summary: dict[str, Any]) -> None:
        for key, value in _numbers(summary).items():
            self.client.log_metric(self.run_id, f"final/{key}", value, step=summary["step"])
        for name in ARTIFACTS:
            if (self.run_dir / name).exists():
                self.client.log_artifact(self.run_id, str(self.run_dir / name))
        self.client.set_terminated(self.run_id)


class WandbTracker:
    """Weights & Biases: offline (files under the run folder, `wandb sync` uploads them)
    unless `logger.wandb.mode=online` and an account is configured."""

    ID_FILE = ".wandb_run_id"

    def __init__(self, cfg: DictConfig, run_dir: Path) -> None:
        try:
            import wandb
        except ImportError:
            raise ConfigError("logger", "wandb", "install the trackers extra first") from None
        settings = cfg.logger.wandb
        self.run_dir, self.wandb = run_dir, wandb
        run_id = _kept_id(run_dir, self.ID_FILE)
        self.run = wandb.init(
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

    def finish(self, summary: dict[str, Any]) -> None:
        self.run.summary.update(_numbers(summary))
        for name in ARTIFACTS:
            if (self.run_dir / name).exists():
                self.run.save(str(self.run_dir / name), base_path=str(self.run_dir))
        self.run.finish()
        # W&B writes through a service process; `finish` can return before it has written
        # everything (the offline log once held only its header). This waits for it.
        self.wandb.teardown()
