"""Trackers follow the sweep: several at once, every step's training loss sent in batches, a
sweep's jobs nested under one MLflow run and grouped and tagged in W&B. Read back with the
libraries' own clients and W&B's offline record."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from conftest import read_summary, run_cli, sweep_said, tiny, train_in_process

# One thread and one worker, as in tests/test_sweeps.py: what a joblib job of a sweep gets.
SWEEP = tiny("trainer.num_threads=1", "dataloader.num_workers=1")


def wandb_records(path: Path):
    """The records of a W&B offline run file (`run-<id>.wandb`, what `wandb sync` uploads):
    a 7-byte file header, then LevelDB-log blocks of 32 KiB whose chunks (a 7-byte header:
    checksum, length, type) make up one protobuf `Record` each (type 1: whole, 4: its last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, pieces = 7, b""
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:  # a block's tail too short for a header is padding
            position += 32768 - position % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pieces += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


@pytest.mark.e2e
@pytest.mark.slow
def test_a_sweeps_jobs_nest_under_one_mlflow_run_and_share_a_wandb_group(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # to read the store here
    store, sweep_dir = f"file:{tmp_path / 'mlruns'}", tmp_path / "sweep"
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_API_KEY": ""}
    env |= {f"WANDB_{name}_DIR": str(tmp_path / "wandb") for name in ("CACHE", "CONFIG", "DATA")}
    done = run_cli(
        "repro.train", "-m", "seed=5", "optimizer.lr=0.05,0.1", "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2", *SWEEP, "logger=[mlflow,wandb]",
        f"logger.mlflow.tracking_uri={store}", f"hydra.sweep.dir={sweep_dir}", env=env,
    )  # fmt: skip
    assert done.returncode == 0, sweep_said(done, sweep_dir)
    lrs = {"0": "0.05", "1": "0.1"}  # job number -> its swept value

    # MLflow: one parent run for the sweep (made once though both jobs started together),
    # finished at the sweep's end with its report; each job's run nested under it, tagged
    # with its seed and swept value, not with the keys every job shares (trainer.epochs).
    client = mlflow.tracking.MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("repro")
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [run for run in runs if "mlflow.parentRunId" not in run.data.tags]
    assert parent.info.run_name == "sweep" and parent.info.status == "FINISHED"
    assert "sweep_summary.json" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    children = {run.info.run_name: run for run in runs if run is not parent}
    assert sorted(children) == ["0", "1"]
    for number, run in children.items():
        tags = run.data.tags
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        assert (tags["seed"], tags["optimizer.lr"]) == ("5", lrs[number])
        assert "trainer.epochs" not in tags and run.info.status == "FINISHED"
        assert run.data.params["optimizer.lr"] == lrs[number]
        job = sweep_dir / number
        assert (job / ".mlflow_run_id").read_text().strip() == run.info.run_id

        # W&B, in the same job: the sweep folder's name as the group, the job's seed and
        # swept value as tags, and the swept value as the job type (a configuration's seeds).
        run_id = (job / ".wandb_run_id").read_text().strip()
        (offline,) = (job / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
        (started, *_) = (r.run for r in wandb_records(offline) if r.HasField("run"))
        assert started.run_group == "sweep"
        assert list(started.tags) == ["seed=5", f"optimizer.lr={lrs[number]}"]
        assert started.job_type == f"optimizer.lr={lrs[number]}"
        losses = {
            record.history.step.num
            for record in wandb_records(offline)
            if record.HasField("history")
            and any(item.nested_key == ["train_loss_step"] for item in record.history.item)
        }
        assert losses == set(range(1, read_summary(job)["step"] + 1))


@pytest.mark.slow
def test_mlflow_and_tensorboard_at_once_get_every_steps_loss_in_one_request_per_flush(
    tmp_path, monkeypatch
):
    mlflow = pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    requests: list[list[str]] = []  # per log_batch call: the metric names it carried
    send = MlflowClient.log_batch

    def counted(self, run_id, metrics=(), params=(), tags=(), **options):
        requests.append([metric.key for metric in metrics])
        return send(self, run_id, metrics, params, tags, **options)

    monkeypatch.setattr(MlflowClient, "log_batch", counted)
    store, run_dir = f"file:{tmp_path / 'mlruns'}", tmp_path / "run"
    # tensorboard named first: the csv base of mlflow's option must not turn it off again.
    # The losses are flushed at each evaluation only (every 6 steps): 12 steps, 2 flushes.
    summary = train_in_process(
        run_dir, *tiny("trainer.epochs=2", "logger.fingerprint_every_steps=50"),
        "logger=[tensorboard,mlflow]", f"logger.mlflow.tracking_uri={store}",
    )  # fmt: skip
    steps = list(range(1, summary["step"] + 1))
    fingerprints = (run_dir / "fingerprints.csv").read_text().splitlines()
    losses = [float(line.split(",")[1]) for line in fingerprints]
    assert len(steps) == 12 and len(losses) == 12

    client = mlflow.tracking.MlflowClient(tracking_uri=store)
    run_id = (run_dir / ".mlflow_run_id").read_text().strip()
    history = client.get_metric_history(run_id, "train_loss_step")
    assert sorted((m.step, m.value) for m in history) == list(zip(steps, losses, strict=True))
    assert [m.step for m in client.get_metric_history(run_id, "val_acc")] == [6, 12]
    # One request per flush of the losses, one per evaluation row, one for the parameters and
    # one at the end: six in all, for 12 steps (a request per step would be 12 for the losses).
    assert sum("train_loss_step" in names for names in requests) == 2
    assert len(requests) == 6

    (events,) = (run_dir / "tb").glob("events.out.tfevents.*")
    board = EventAccumulator(str(events))
    board.Reload()
    assert [event.step for event in board.Scalars("train_loss_step")] == steps
    assert [event.value for event in board.Scalars("train_loss_step")] == pytest.approx(losses)
    assert [event.step for event in board.Scalars("val_acc")] == [6, 12]
