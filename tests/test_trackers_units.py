"""The experiment trackers (repro.core.watch.trackers) in this process, without training: what an
MLflow run receives, read back from a real local store with MLflow's client; a sweep's jobs
nested under its run; what W&B's `init` is asked for; a tracker that cannot start as one line.
A whole run's tracking, W&B's offline files included, is test_trackers'."""

from __future__ import annotations

import fcntl
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from repro.core.errors import UserError
from repro.core.watch import trackers
from repro.core.watch.loggers import STEP_LOSS

from conftest import compose_config, tiny

mlflow = pytest.importorskip("mlflow")


def mlflow_config(store: Path, *overrides: str):
    return compose_config(*tiny("logger=mlflow", f"logger.mlflow.tracking_uri=file:{store}"))


def test_an_mlflow_run_gets_the_config_the_rows_the_losses_and_the_end(tmp_path):
    store, run_dir = tmp_path / "mlruns", tmp_path / "run"
    run_dir.mkdir()
    cfg = mlflow_config(store)
    tracker = trackers.MlflowTracker(cfg, run_dir)
    tracker.metrics({"epoch": 1, "step": 6, "val_acc": 0.5, "val_loss": 2}, step=6)
    tracker.losses(3, [1.5, 1.25])
    (run_dir / "summary.json").write_text("{}")
    (run_dir / "metrics.csv").write_text("step\n")
    tracker.finish({"step": 6, "val_acc": 0.5, "completed": True, "amp": "off", "seed": 0})
    client = mlflow.tracking.MlflowClient(tracking_uri=f"file:{store}")
    run = client.get_run((run_dir / ".mlflow_run_id").read_text().strip())
    assert run.info.run_id == tracker.run_id and run.info.run_name == "run"
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "repro"
    assert run.data.params == trackers._parameters(cfg)
    assert run.data.params["trainer.batch_size"] == "64"
    assert run.data.metrics == {
        "val_acc": 0.5,
        "val_loss": 2.0,
        STEP_LOSS: 1.25,
        "final/step": 6.0,
        "final/val_acc": 0.5,
        "final/seed": 0.0,
    }
    history = client.get_metric_history(run.info.run_id, STEP_LOSS)
    assert [(m.step, m.value) for m in history] == [(3, 1.5), (4, 1.25)]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "final/val_acc")] == [6]
    artifacts = {item.path for item in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"summary.json", "metrics.csv"}  # those the folder holds

    again = trackers.MlflowTracker(cfg, run_dir)  # a resume: the same run, its params kept
    assert again.run_id == tracker.run_id
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_a_sweeps_jobs_nest_under_one_run_that_gets_the_report_at_the_end(tmp_path):
    store, sweep_dir = tmp_path / "mlruns", tmp_path / "sweep"
    cfg = mlflow_config(store)
    jobs = []
    for number, seed in enumerate(("0", "1")):
        run_dir = sweep_dir / str(number)
        run_dir.mkdir(parents=True)
        sweep = trackers.Sweep(sweep_dir, {"seed": seed, "optimizer.lr": "0.1"})
        jobs.append(trackers.MlflowTracker(cfg, run_dir, sweep))
    client = mlflow.tracking.MlflowClient(tracking_uri=f"file:{store}")
    parent = (sweep_dir / ".mlflow_parent_run_id").read_text().strip()
    assert client.get_run(parent).info.run_name == "sweep"
    experiment = client.get_experiment(client.get_run(parent).info.experiment_id)
    assert experiment.name == "repro"  # the jobs' experiment, not MLflow's default
    assert {client.get_run(job.run_id).info.experiment_id for job in jobs} == {
        experiment.experiment_id
    }
    assert (sweep_dir / ".mlflow_parent.lock").is_file()  # the jobs' lock, in the sweep folder
    for job, seed in zip(jobs, ("0", "1"), strict=True):
        tags = client.get_run(job.run_id).data.tags
        assert tags["mlflow.parentRunId"] == parent
        assert (tags["seed"], tags["optimizer.lr"]) == (seed, "0.1")
    (sweep_dir / "sweep_summary.md").write_text("| seed |\n")
    (sweep_dir / "other.txt").write_text("not the report\n")
    trackers.end_sweep(cfg, sweep_dir)
    finished = client.get_run(parent)
    assert finished.info.status == "FINISHED"
    assert {item.path for item in client.list_artifacts(parent)} == {"sweep_summary.md"}
    unnested = tmp_path / "plain"
    unnested.mkdir()
    trackers.end_sweep(cfg, unnested)  # no parent run kept: nothing to finish
    trackers.end_sweep(compose_config(*tiny()), sweep_dir)  # no MLflow asked for


def lock_held(sweep_dir: Path) -> bool:
    """Whether someone holds the sweep's lock (flock: a second open of the file is refused)."""
    with open(sweep_dir / ".mlflow_parent.lock", "a") as other:
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(other, fcntl.LOCK_UN)
        return False


def test_a_sweeps_job_makes_its_client_and_runs_one_job_at_a_time(tmp_path, monkeypatch):
    # A fresh file store's first client writes MLflow's default experiment: a second job's
    # client reading it half-written fails (a TypeError in MLflow), so jobs take turns.
    sweep_dir, run_dir = tmp_path / "sweep", tmp_path / "sweep" / "0"
    run_dir.mkdir(parents=True)
    cfg, held, real = mlflow_config(tmp_path / "mlruns"), [], trackers.mlflow_client

    def client(uri):
        held.append(("client", lock_held(sweep_dir)))
        return real(uri)

    monkeypatch.setattr(trackers, "mlflow_client", client)
    sweep = trackers.Sweep(sweep_dir, {"seed": "0"})
    job = trackers.MlflowTracker(cfg, run_dir, sweep)
    held.append(("after", lock_held(sweep_dir)))
    trackers.MlflowTracker(cfg, run_dir, sweep)  # a resume: its client under the lock too
    (tmp_path / "alone").mkdir()
    trackers.MlflowTracker(cfg, tmp_path / "alone")  # no sweep: no lock
    assert held == [("client", True), ("after", False), ("client", True), ("client", False)]
    assert job.client.get_run(job.run_id).data.tags["seed"] == "0"


def test_an_experiment_another_process_made_meanwhile_is_joined(tmp_path, monkeypatch):
    from mlflow.exceptions import MlflowException

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = mlflow_config(tmp_path / "mlruns")
    tracker = trackers.MlflowTracker(cfg, run_dir)
    made = tracker.client.create_experiment("theirs")
    looked: list[str] = []
    real_lookup = tracker.client.get_experiment_by_name

    def late_lookup(name):  # our first lookup misses it; they make it before we do
        looked.append(name)
        return None if len(looked) == 1 else real_lookup(name)

    monkeypatch.setattr(tracker.client, "get_experiment_by_name", late_lookup)
    assert tracker._experiment("theirs") == made and looked == ["theirs", "theirs"]

    def refuse(name):
        raise MlflowException("the store is read-only", error_code="PERMISSION_DENIED")

    looked.clear()
    monkeypatch.setattr(tracker.client, "create_experiment", refuse)
    with pytest.raises(MlflowException, match="read-only"):
        tracker._experiment("theirs")


@pytest.mark.parametrize(
    "setting, uri",
    [
        (None, (Path.cwd() / "outputs" / "mlruns").as_uri()),
        ("", (Path.cwd() / "outputs" / "mlruns").as_uri()),
        ("http://tracker:5000", "http://tracker:5000"),
        ("sqlite:///runs.db", "sqlite:///runs.db"),
        ("file:/data/mlruns", "file:/data/mlruns"),
        ("stores/mlruns", (Path.cwd() / "stores" / "mlruns").as_uri()),
        ("~/mlruns", (Path.home() / "mlruns").as_uri()),
    ],
)
def test_the_tracking_uri_is_mlflows_with_a_plain_path_a_local_store(setting, uri):
    assert trackers.mlflow_uri(setting) == uri


def test_an_mlflow_server_is_named_before_mlflows_retries_and_a_file_store_is_allowed(
    monkeypatch, caplog
):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with caplog.at_level("INFO", logger="repro.core.watch.trackers"):
        trackers.mlflow_client("http://tracker:5000")
    assert caplog.messages == [
        "logger=mlflow: starting a run at http://tracker:5000 (MLflow retries a server that "
        "does not answer for minutes; MLFLOW_HTTP_REQUEST_MAX_RETRIES=1 gives up sooner)"
    ]
    assert "MLFLOW_ALLOW_FILE_STORE" not in trackers.os.environ
    trackers.mlflow_client("file:/nowhere")
    assert trackers.os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"
    assert len(caplog.messages) == 1


class Wandb:
    """The wandb module as a WandbTracker uses it: each call recorded, a run whose id is
    `given`."""

    def __init__(self) -> None:
        self.calls: list = []

    def init(self, **settings):
        self.calls.append(("init", settings))
        return SimpleNamespace(
            id=settings["id"] or "new-id",
            log=lambda values, step: self.calls.append(("log", values, step)),
            summary=SimpleNamespace(update=lambda values: self.calls.append(("summary", values))),
            save=lambda path, base_path: self.calls.append(("save", path, base_path)),
            finish=lambda: self.calls.append(("finish",)),
        )

    def teardown(self) -> None:
        self.calls.append(("teardown",))


def test_a_wandb_run_is_asked_for_its_group_tags_and_job_type_and_resumed_by_its_id(
    tmp_path, monkeypatch
):
    fake = Wandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = compose_config(*tiny("logger=wandb"))
    run_dir = tmp_path / "sweep" / "3"
    run_dir.mkdir(parents=True)
    long = "x" * 70
    sweep = trackers.Sweep(tmp_path / "sweep", {"seed": "2", "optimizer.lr": "0.1", "k": long})
    tracker = trackers.WandbTracker(cfg, run_dir, sweep)
    (_, asked), *_ = fake.calls
    tags = ["seed=2", "optimizer.lr=0.1", f"k={long}"[:64]]
    assert asked == {
        "group": "sweep",
        "tags": tags,
        "job_type": f"optimizer.lr=0.1 k={long}"[:64],
        "project": "repro",
        "mode": "offline",
        "dir": str(run_dir),
        "id": None,
        "resume": None,
        "name": "3",
        "config": trackers._parameters(cfg),
    }
    assert (run_dir / ".wandb_run_id").read_text() == "new-id\n"
    tracker.metrics({"step": 6, "epoch": 1, "val_acc": 0.5, "ok": True}, step=6)
    tracker.losses(4, [1.5, 1.25])
    (run_dir / "curves.png").write_bytes(b"png")
    tracker.finish({"step": 6, "val_acc": 0.5, "amp": "off"})
    assert fake.calls[1:] == [
        ("log", {"epoch": 1.0, "val_acc": 0.5}, 6),
        ("log", {STEP_LOSS: 1.5}, 4),
        ("log", {STEP_LOSS: 1.25}, 5),
        ("summary", {"step": 6.0, "val_acc": 0.5}),
        ("save", str(run_dir / "curves.png"), str(run_dir)),
        ("finish",),
        ("teardown",),
    ]
    fake.calls.clear()
    trackers.WandbTracker(cfg, run_dir)  # a resume of the same folder, outside a sweep
    (_, asked), *_ = fake.calls
    assert (asked["id"], asked["resume"], asked["group"]) == ("new-id", "allow", None)
    assert (asked["tags"], asked["job_type"]) == ([], None)
    single = trackers.Sweep(tmp_path / "sweep", {"seed": "2"})
    fake.calls.clear()
    trackers.WandbTracker(cfg, tmp_path / "sweep", single)
    assert fake.calls[0][1]["job_type"] is None  # the seed alone sets no configuration apart


def test_a_tracker_that_cannot_start_is_one_line_of_at_most_400_characters_of_its_error():
    class Broken:
        def __init__(self, cfg, run_dir, sweep) -> None:
            raise RuntimeError("the server\nsaid   no " + "y" * 500)

    with pytest.raises(UserError) as refused:
        trackers._start(Broken, "mlflow", None, Path("."), None)
    said = " ".join(("the server said no " + "y" * 500).split())
    assert str(refused.value) == (
        f"logger=mlflow: the tracker could not start (RuntimeError: {said[:400]} ...)"
    )

    class Short(Broken):
        def __init__(self, cfg, run_dir, sweep) -> None:
            raise OSError("no store")

    with pytest.raises(UserError) as refused:
        trackers._start(Short, "wandb", None, Path("."), None)
    assert str(refused.value) == "logger=wandb: the tracker could not start (OSError: no store)"

    class Refusing(Broken):
        def __init__(self, cfg, run_dir, sweep) -> None:
            raise UserError("its own words")

    with pytest.raises(UserError, match=r"^its own words$"):
        trackers._start(Refusing, "wandb", None, Path("."), None)


def test_only_the_trackers_asked_for_start_and_outside_a_sweep_none_is_nested(
    tmp_path, monkeypatch
):
    started = []
    monkeypatch.setattr(trackers, "_start", lambda kind, name, *rest: started.append((name, rest)))
    assert trackers.from_config(compose_config(*tiny()), tmp_path) == []
    assert started == []
    both = compose_config(*tiny("logger=[mlflow,wandb]"))
    trackers.from_config(both, tmp_path)
    assert started == [("mlflow", (both, tmp_path, None)), ("wandb", (both, tmp_path, None))]


def test_a_sweep_record_gives_its_command_lines_overrides_and_anything_else_is_refused(tmp_path):
    record = tmp_path / "multirun.yaml"
    record.write_text("hydra:\n  overrides:\n    task: ['seed=0,1', 'optimizer.lr=${oops}']\n")
    assert trackers._recorded_task(record, tmp_path) == ["seed=0,1", "optimizer.lr=${oops}"]
    for text in ("hydra: {}\n", "hydra:\n  overrides:\n    task: [1, 2]\n", "[]\n"):
        record.write_text(text)
        with pytest.raises(UserError) as refused:
            trackers._recorded_task(record, tmp_path)
        assert str(refused.value) == (
            f"{record}: not a sweep record (no list of hydra.overrides.task)"
        )


def test_a_summarys_numbers_are_its_ints_and_floats_not_its_flags():
    numbers = trackers._numbers({"a": 1, "b": 0.5, "c": True, "d": "x", "e": None, "f": [1]})
    assert numbers == {"a": 1.0, "b": 0.5} and all(type(v) is float for v in numbers.values())


@pytest.fixture
def job_of_a_sweep(tmp_path):
    """Hydra's config of a job of a multirun over `task`, whose sweep folder holds a
    multirun.yaml recording `recorded` (none if None)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from conftest import CONF

    def enter(task: list[str], recorded: list[str] | None, mode=RunMode.MULTIRUN):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("config", ["seed.value=5"], return_hydra_config=True)
        cfg.hydra.mode = mode
        cfg.hydra.sweep.dir = str(tmp_path / "sweep")
        cfg.hydra.overrides.task = task
        (tmp_path / "sweep").mkdir(exist_ok=True)
        (tmp_path / "sweep" / "multirun.yaml").unlink(missing_ok=True)
        if recorded is not None:
            record = {"hydra": {"overrides": {"task": recorded}}}
            (tmp_path / "sweep" / "multirun.yaml").write_text(OmegaConf.to_yaml(record))
        HydraConfig.instance().set_config(cfg)
        return cfg

    yield enter
    HydraConfig.instance().cfg = None


def test_a_jobs_sweep_is_its_folder_and_the_values_its_command_line_sweeps(job_of_a_sweep):
    from hydra.types import RunMode

    cfg = job_of_a_sweep(
        ["seed=5", "optimizer.lr=0.2", "trainer.epochs=2", "+data.extra=x"],
        ["seed=4,5", "optimizer.lr=0.1,0.2", "trainer.epochs=2", "+data.extra=x"],
    )
    sweep = trackers.sweep_of(cfg)
    assert sweep == trackers.Sweep(Path(cfg.hydra.sweep.dir), {"seed": "5", "optimizer.lr": "0.2"})
    cfg = job_of_a_sweep(["seed.value=5", "optimizer.lr=0.2", "trainer.epochs=2"], None)
    assert trackers.sweep_of(cfg).tags == {  # no record: each override but the seed's
        "seed": "5",
        "optimizer.lr": "0.2",
        "trainer.epochs": "2",
    }
    cfg = job_of_a_sweep(["optimizer.lr=0.2"], None, mode=RunMode.RUN)
    assert trackers.sweep_of(cfg) is None


def test_in_a_sweep_each_tracker_starts_as_a_job_of_it(job_of_a_sweep, tmp_path, monkeypatch):
    cfg = job_of_a_sweep(["optimizer.lr=0.2"], ["optimizer.lr=0.1,0.2"])
    started = []
    monkeypatch.setattr(trackers, "_start", lambda kind, name, *rest: started.append(rest[2]))
    with_mlflow = OmegaConf.merge(cfg, {"logger": {"mlflow": {"tracking_uri": None}}})
    trackers.from_config(with_mlflow, tmp_path)
    assert started == [trackers.Sweep(tmp_path / "sweep", {"seed": "5", "optimizer.lr": "0.2"})]


def test_a_tracker_starts_with_the_run_its_folder_and_its_sweep(tmp_path):
    class Kind:
        def __init__(self, *given) -> None:
            self.given = given

    sweep = trackers.Sweep(tmp_path, {"seed": "1"})
    started = trackers._start(Kind, "mlflow", "cfg", tmp_path / "run", sweep)
    assert started.given == ("cfg", tmp_path / "run", sweep)

    class Exactly400(Kind):
        def __init__(self, *given) -> None:
            raise RuntimeError("y" * 400)

    with pytest.raises(UserError) as refused:
        trackers._start(Exactly400, "wandb", None, tmp_path, None)
    assert str(refused.value).endswith(f"(RuntimeError: {'y' * 400})")


@pytest.mark.parametrize("missing, logger", [("wandb", "wandb"), ("mlflow.tracking", "mlflow")])
def test_a_tracker_whose_library_is_missing_says_to_install_the_extra(
    missing, logger, tmp_path, monkeypatch
):
    from repro.core.errors import ConfigError

    monkeypatch.setitem(sys.modules, missing, None)  # as if never installed
    with pytest.raises(ConfigError) as refused:
        if logger == "wandb":
            trackers.WandbTracker(compose_config(*tiny("logger=wandb")), tmp_path)
        else:
            trackers.mlflow_client(None)
    assert str(refused.value) == (
        f"logger='{logger}' is not allowed: install the trackers extra first"
    )


def test_an_mlflow_points_time_is_the_moment_it_is_sent_in_milliseconds(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tracker = trackers.MlflowTracker(mlflow_config(tmp_path / "mlruns"), run_dir)
    before = int(time.time() * 1000)
    tracker.metrics({"step": 2, "val_acc": 0.5}, step=2)
    after = int(time.time() * 1000)
    (point,) = tracker.client.get_metric_history(tracker.run_id, "val_acc")
    assert before <= point.timestamp <= after and point.step == 2


def test_the_parameters_are_the_config_resolved_each_as_text():
    config = OmegaConf.create({"a": 1, "b": "${a}", "c": {"d": [1, 2]}})
    assert trackers._parameters(config) == {"a": "1", "b": "1", "c.d": "[1, 2]"}


def test_an_https_server_is_named_too(caplog):
    with caplog.at_level("INFO", logger="repro.core.watch.trackers"):
        trackers.mlflow_client("https://tracker.example")
    assert caplog.messages[0].startswith("logger=mlflow: starting a run at https://tracker.example")
