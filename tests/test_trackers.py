"""logger=mlflow and logger=wandb, read back with the libraries' own clients."""

from __future__ import annotations

import json
import subprocess

import pytest

from repro.core.errors import UserError

from conftest import ROOT, tiny, train_in_process

RUN = tiny("trainer.epochs=2")


def test_mlflow_records_params_metrics_and_artifacts_that_its_client_reads(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    store = f"file:{tmp_path / 'mlruns'}"
    run_dir = tmp_path / "run"
    summary = train_in_process(
        run_dir, *RUN, "logger=mlflow", f"logger.mlflow.tracking_uri={store}"
    )
    client = mlflow.tracking.MlflowClient(tracking_uri=store)
    run = client.get_run((run_dir / ".mlflow_run_id").read_text().strip())
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["trainer.epochs"] == "2" and run.data.params["seed.value"] == "0"
    history = client.get_metric_history(run.info.run_id, "val_acc")
    assert [m.step for m in history] == [6, 12]  # one per evaluation (epoch ends), at its step
    assert history[-1].value == summary["val_acc"]
    assert run.data.metrics["final/test_acc"] == summary["test_acc"]
    artifacts = {item.path for item in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "metrics.csv", "resolved_config.yaml"} <= artifacts


@pytest.mark.slow
def test_wandb_offline_records_the_same_run_in_the_run_folder(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    try:
        summary = train_in_process(run_dir, *RUN, "logger=wandb")
    except Exception as error:
        if "wandb" in type(error).__module__:
            pytest.skip(f"W&B cannot run offline here: {error}")
        raise
    run_id = (run_dir / ".wandb_run_id").read_text().strip()
    offline = list((run_dir / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(offline) == 1
    files = {path.name for path in offline[0].rglob("*") if path.is_file()}
    assert {"summary.json", "metrics.csv", "resolved_config.yaml"} <= files  # run.save
    # The run's records, as W&B's offline transaction log holds them (protobuf: the keys and
    # the JSON-encoded values appear as they are); `wandb sync` uploads this file.
    log = (offline[0] / f"run-{run_id}.wandb").read_bytes()
    for key in (b"trainer.epochs", b"val_acc", b"test_acc", b"best_step"):
        assert key in log, key
    assert repr(summary["test_acc"]).encode() in log


@pytest.mark.slow
def test_an_mlflow_experiment_made_by_another_process_meanwhile_is_joined(tmp_path, monkeypatch):
    """Two runs starting together both find no experiment; the second one's creation is
    refused by MLflow, and that run must join the first one's experiment, not fail."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for the other process's client
    store = f"file:{tmp_path / 'mlruns'}"
    other = MlflowClient(tracking_uri=store)
    look_up = MlflowClient.get_experiment_by_name
    made: list[str] = []

    def too_early(self, name):  # the other process creates it just after our lookup
        if not made:
            made.append(other.create_experiment(name))
            return None
        return look_up(self, name)

    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", too_early)
    run_dir = tmp_path / "run"
    train_in_process(run_dir, *RUN, "logger=mlflow", f"logger.mlflow.tracking_uri={store}")
    run = other.get_run((run_dir / ".mlflow_run_id").read_text().strip())
    assert run.info.experiment_id == made[0] and run.info.status == "FINISHED"
    assert [e.name for e in other.search_experiments()].count("repro") == 1


def test_mlflow_takes_a_plain_path_as_a_local_store(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    store = tmp_path / "store"  # no scheme, as MLflow's own docs write it
    train_in_process(tmp_path / "run", *RUN, "logger=mlflow", f"logger.mlflow.tracking_uri={store}")
    client = mlflow.tracking.MlflowClient(tracking_uri=store.as_uri())
    run = client.get_run((tmp_path / "run" / ".mlflow_run_id").read_text().strip())
    assert run.info.status == "FINISHED"


@pytest.mark.slow
def test_the_default_mlflow_store_is_under_outputs_and_ignored_by_git(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)
    train_in_process(tmp_path / "run", *RUN, "logger=mlflow")
    stored = [p.relative_to(tmp_path) for p in (tmp_path / "outputs" / "mlruns").rglob("*")]
    assert stored and not (tmp_path / "mlruns").exists()
    # In the template, that place is ignored: `git add .` and new_project.py leave it out.
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *(str(p) for p in stored[:3]), "mlruns/x"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert len(ignored.stdout.split()) == min(3, len(stored)) + 1, ignored


def test_a_tracker_that_cannot_start_is_one_line_and_fails_the_attempt(tmp_path):
    pytest.importorskip("mlflow")
    run_dir = tmp_path / "run"
    bad = ["logger=mlflow", "logger.mlflow.tracking_uri=nowhere://store"]
    with pytest.raises(UserError, match="logger=mlflow: the tracker could not start") as refused:
        train_in_process(run_dir, *RUN, *bad)
    assert "\n" not in str(refused.value)
    (attempt,) = (
        json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()
    )
    assert attempt["result"].startswith("failed: logger=mlflow: the tracker could not start")
