"""Files from someone else are data (docs/security.md): what a run folder, sweep folder or
checkpoint records decides values only, never what runs, where we write or what we send.
One regression test per way the issue found through; tests/test_folder_guard.py holds the
symlinks, tests/test_escape.py the escaping, tests/test_files_from_others_fuzz.py the fuzzer."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from repro.core import overrides as recorded_overrides
from repro.core.errors import DataError
from repro.core.guards import network
from repro.core.runs import checkpoint, trust
from repro.core.runs.trust import UntrustedConfigError
from repro.evaluate import main as evaluate_main
from repro.resume import command as resume
from repro.verify import command as verify

from conftest import ROOT, tiny, train_in_process

RUN = tiny("trainer.max_steps=2", "model.widths=[8,16]")


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def exit_code(main, *argv: str) -> int:
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    return done.value.code


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    train_in_process(run_dir, *RUN)
    return run_dir


# --- 1. repro.resume relaunches values, never code, settings or places from the record ---


def shell_callback(marker: Path) -> list[str]:
    """The issue's payload: a Hydra callback that runs a shell command when the job starts."""
    return [
        "+hydra.callbacks.x._target_=asyncio.run",
        "+hydra.callbacks.x.main._target_=asyncio.create_subprocess_shell",
        f"+hydra.callbacks.x.main.cmd='touch {marker}'",
    ]


def run_record(folder: Path, hydra: list[str], task: list[str], **job) -> Path:
    """A run folder holding only .hydra/hydra.yaml, as the issue's attacker made it."""
    (folder / ".hydra").mkdir(parents=True)
    record = {
        "mode": "RUN",
        "job": {"num": 0, "config_name": "config", **job},
        "runtime": {"cwd": str(folder)},
        "overrides": {"hydra": hydra, "task": task},
    }
    (folder / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": record}))
    return folder


def sweep_record(folder: Path, hydra: list[str], task: list[str]) -> Path:
    folder.mkdir(parents=True)
    record = {
        "mode": "MULTIRUN",
        "job": {"config_name": "config"},
        "runtime": {"cwd": str(folder)},
        "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"},
        "overrides": {"hydra": ["hydra.mode=MULTIRUN", *hydra], "task": task},
    }
    (folder / "multirun.yaml").write_text(yaml.safe_dump({"hydra": record}))
    return folder


PAYLOADS = {  # name -> (hydra overrides, task overrides); the marker is filled in
    "hydra callback": (shell_callback, lambda m: []),
    "hydra search path": (lambda m: [f"hydra.searchpath=[file://{m.parent}]"], lambda m: []),
    "hydra env": (lambda m: ["hydra.job.env_set.LD_PRELOAD=/tmp/x.so"], lambda m: []),
    "optuna search space": (
        lambda m: ["hydra/sweeper=optuna_study", "hydra.sweeper.custom_search_space=os.system"],
        lambda m: [],
    ),
    "new target": (lambda m: [], lambda m: ["+callbacks.x._target_=pathlib.Path.touch"]),
    "target in a value": (lambda m: [], lambda m: ["+callbacks.x={_target_: os.system}"]),
    "interpolation": (lambda m: [], lambda m: ["trainer.tta=x${oc.env:HOME}"]),
    "group as a path": (lambda m: [], lambda m: [f"model=../../../..{m.parent}/evil"]),
    "package into hydra": (
        lambda m: [],
        lambda m: [f"+model@hydra.callbacks=../../..{m.parent}/x"],
    ),
    "group path in the key": (lambda m: [], lambda m: ["+model/..=evil"]),
    "tracker destination": (lambda m: [], lambda m: [f"logger.mlflow.tracking_uri={m}"]),
    "download": (lambda m: [], lambda m: ["data.download=true", f"data.root={m}"]),
    # Places: the record's server, cache folder and an option that downloads by default.
    "endpoint": (
        lambda m: [],
        lambda m: ["data=shards", "data.root=s3://b/p", "data.endpoint_url=http://their.host"],
    ),
    "cache folder": (lambda m: [], lambda m: ["data=shards", f"data.cache_dir={m.parent}"]),
    "option that downloads": (lambda m: [], lambda m: ["data=cifar10"]),
}


@pytest.mark.parametrize("kind", ["run", "sweep", "attempts"])
@pytest.mark.parametrize("payload", sorted(PAYLOADS))
def test_resume_refuses_every_recorded_override_that_is_more_than_a_value(
    payload, kind, tmp_path, capsys
):
    marker = tmp_path / "outside" / "marker"
    marker.parent.mkdir()
    hydra, task = (make(marker) for make in PAYLOADS[payload])
    if kind == "sweep":
        folder = sweep_record(tmp_path / "sweep", hydra, [*task, "seed.value=0,1"])
    elif kind == "run":
        folder = run_record(tmp_path / "run", hydra, task)
    else:  # a run's last attempt's overrides are what it reruns
        folder = run_record(tmp_path / "run", hydra, [])
        line = {"attempt": 1, "overrides": task, "result": "running", "env": {}}
        (folder / "attempts.jsonl").write_text(json.dumps(line) + "\n")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert exit_code(resume.main, str(folder)) == 2
    assert "refused" in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # not even run.lock
    assert not marker.exists()


@pytest.mark.parametrize(
    ("job", "env", "expected"),
    [
        ({"config_name": "../../../tmp/evil"}, {}, "config name '../../../tmp/evil' is refused"),
        ({"config_name": "bench"}, {}, "config name 'bench' is refused"),
        ({}, {"pythonhashseed": "0 -c import os"}, "hash seed"),
        ({}, {"pythonhashseed": 2**32}, "hash seed"),  # Python's own limit: it would stop
    ],
)
def test_resume_refuses_a_config_name_or_hash_seed_that_is_not_ours(
    job, env, expected, tmp_path, capsys
):
    folder = run_record(tmp_path / "run", [], [], **job)
    line = {"attempt": 1, "overrides": [], "result": "running", "env": env}
    (folder / "attempts.jsonl").write_text(json.dumps(line) + "\n")
    assert exit_code(resume.main, str(folder)) == 2
    assert expected in one_error_line(capsys)


@pytest.mark.parametrize(
    "record",
    [
        "hydra: [1, 2]",
        "hydra: {mode: RUN, job: {num: 0}}",
        "hydra: {mode: RUN, job: {config_name: config}, overrides: {hydra: [], task: [3]}}",
        "hydra: {mode: RUN, job: {config_name: config}, overrides: {hydra: [], task: x=1}}",
        "{{{",
    ],
)
def test_a_damaged_record_is_one_line(record, tmp_path, capsys):
    (tmp_path / "run" / ".hydra").mkdir(parents=True)
    (tmp_path / "run" / ".hydra" / "hydra.yaml").write_text(record)
    assert exit_code(resume.main, str(tmp_path / "run")) == 2
    one_error_line(capsys)


@pytest.mark.e2e
@pytest.mark.slow
def test_resume_runs_in_this_directory_and_never_imports_from_the_recorded_one(tmp_path):
    marker = tmp_path / "marker"
    planted = tmp_path / "planted"
    (planted / "repro").mkdir(parents=True)
    (planted / "repro" / "__init__.py").write_text("")
    (planted / "repro" / "train.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    folder = run_record(tmp_path / "run", [], tiny("trainer.max_steps=2"))
    record = yaml.safe_load((folder / ".hydra" / "hydra.yaml").read_text())
    record["hydra"]["runtime"]["cwd"] = str(planted)
    (folder / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(record))
    done = subprocess.run(  # from another folder: the relaunch runs here, not where recorded
        [sys.executable, "-m", "repro.resume", str(folder)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    assert json.loads((folder / "summary.json").read_text())["completed"]


@pytest.mark.parametrize(
    "override",
    [
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "hydra.sweep.dir=/somewhere",
        "hydra.mode=MULTIRUN",
        "seed.value=0,1,2",
        "trainer.epochs=1,2",
        "model=resnet9",
        "logger=[csv,mlflow]",
        "+experiment=cifar10_resnet18",
        "data.root=/data/cifar",
        "data.download=false",
        "optimizer.lr=choice(0.1,0.05)",
        "~trainer.halt_at_step",
    ],
)
def test_a_value_or_an_option_of_this_checkout_is_relaunched(override):
    assert recorded_overrides.check([override], "record") == [override]


def test_trust_true_relaunches_what_the_user_vouches_for():
    risky = ["hydra.launcher.setup=[echo hi]", "+callbacks.x._target_=theirs.Callback"]
    assert recorded_overrides.check(risky, "record", trust=True) == risky
    with pytest.raises(UntrustedConfigError, match=r"hydra\.launcher\.setup"):
        recorded_overrides.check(risky, "record")


# --- 3. verify and evaluate log to no tracker, download nothing, reach no network ---


def test_verify_takes_no_tracker_and_no_download_from_the_record(trained, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    resolved = yaml.safe_load((run_dir / "resolved_config.yaml").read_text())
    store = tmp_path / "outside" / "mlruns"
    resolved["logger"]["mlflow"] = {"tracking_uri": f"file://{store}", "experiment": "x"}
    resolved["data"]["download"] = True
    (run_dir / "resolved_config.yaml").write_text(yaml.safe_dump(resolved))
    assert exit_code(verify.main, str(run_dir), "steps=2") == 0  # logging changes no result
    assert "identical" in capsys.readouterr().out
    assert not (tmp_path / "outside").exists()


def test_verify_downloads_no_dataset_the_record_names(trained, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    resolved = yaml.safe_load((run_dir / "resolved_config.yaml").read_text())
    root = tmp_path / "outside" / "cifar"
    resolved["data"].update(
        _target_="repro.core.data.datasets.cifar10", download=True, root=str(root)
    )
    (run_dir / "resolved_config.yaml").write_text(yaml.safe_dump(resolved))
    assert exit_code(verify.main, str(run_dir), "steps=2") == 2
    one_error_line(capsys)
    assert not (tmp_path / "outside").exists()


def test_nothing_reaches_the_network_inside_offline():
    import socket
    import urllib.request

    offline_error = network.NetworkRefusedError

    with network.offline("the config comes from a file"):
        with pytest.raises(network.NetworkRefusedError, match="download=true"):
            socket.create_connection(("192.0.2.1", 80), timeout=0.1)  # TEST-NET: never routed
        with pytest.raises(network.NetworkRefusedError):
            socket.getaddrinfo("example.com", 443)
        with pytest.raises(offline_error):  # a file:// URL too: torch.hub copies what it opens
            urllib.request.urlopen("file:///etc/hostname")
        left, right = socket.socketpair()  # local sockets (workers' pipes) are not touched
        left.close(), right.close()
    with pytest.raises(OSError):  # outside the block: refused by the network, not by us
        try:
            socket.create_connection(("192.0.2.1", 80), timeout=0.01)
        except network.NetworkRefusedError:
            pytest.fail("still refusing after the block")


def test_verify_fetches_no_weights_from_a_url_or_into_a_folder_the_record_names(
    trained, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    resolved = yaml.safe_load((run_dir / "resolved_config.yaml").read_text())
    resolved["model"] = {
        "_target_": "repro.extras.models.pretrained.timm_model", "name": "resnet18", "pretrained": True,
        "num_classes": 10, "cache_dir": str(tmp_path / "outside" / "made"),
        "pretrained_cfg_overlay": {"url": "file:///etc/hostname", "hf_hub_id": None},
    }  # fmt: skip
    (run_dir / "resolved_config.yaml").write_text(yaml.safe_dump(resolved))
    assert exit_code(verify.main, str(run_dir), "steps=2") == 2
    assert "model.pretrained_cfg" in one_error_line(capsys)
    assert not (tmp_path / "outside").exists()


# --- 4. the trusted set: tracked conf/ YAML, parsed, and one local list ---


def test_only_tracked_yaml_and_the_local_list_add_trusted_targets(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    (conf / "model").mkdir(parents=True)
    (conf / "local").mkdir()
    (conf / "model" / "ours.yaml").write_text("_target_: ournets.Net\nwidth: 3\n")
    (conf / "model" / "notes.yaml").write_text("doc: |\n  _target_: os.system\n- _target_: x\n")
    (conf / "model" / "meta.yaml").write_text("text: |\n  _target_: subprocess.run\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "conf"], check=True)
    (conf / "model" / "written_by_a_run.yaml").write_text("_target_: builtins.exec\n")
    (conf / "local" / "trusted.yaml").write_text("- _target_: theirnets.Net\n")
    (conf / "local" / "default.yaml").write_text("model:\n  _target_: shutil.rmtree\n")
    monkeypatch.setattr(trust, "CONF", conf)
    trust.conf_targets.cache_clear()
    try:
        assert trust.conf_targets() == {"ournets.Net": {"model"}, "theirnets.Net": {None}}
    finally:
        monkeypatch.undo()
        trust.conf_targets.cache_clear()


# --- 5. trusted targets with values that would fetch or write elsewhere ---


def crafted(trained: Path, folder: Path, edit) -> Path:
    state = checkpoint.load(trained / "checkpoints" / "last.pt")
    edit(state["config"])
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint.atomic_save(state, folder / "crafted.pt")
    return folder / "crafted.pt"


def test_a_model_builder_is_trusted_only_where_models_are_built(trained, tmp_path, capsys):
    def edit(config):
        config["augment"]["transforms"] = [
            {"_target_": "torchvision.models.resnet18", "weights": "DEFAULT"}
        ]

    ckpt = crafted(trained, tmp_path, edit)
    assert exit_code(evaluate_main, f"ckpt={ckpt}") == 2
    assert "augment.transforms[0]._target_" in one_error_line(capsys)


def nested_weights(config: dict, outside: Path) -> None:
    config["model"]["backbone"] = {"_target_": "torchvision.models.resnet18", "weights": "DEFAULT"}


def dataset_download(config: dict, outside: Path) -> None:
    config["data"].update(
        _target_="repro.core.data.datasets.cifar10", download=True, root=str(outside)
    )


@pytest.mark.parametrize("edit", [nested_weights, dataset_download])
def test_evaluate_fetches_no_weights_and_no_data_the_checkpoint_names(
    edit, trained, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    outside = tmp_path / "outside" / "cifar"
    ckpt = crafted(trained, tmp_path / "ckpt", lambda config: edit(config, outside))
    assert exit_code(evaluate_main, f"ckpt={ckpt}") == 2
    one_error_line(capsys)
    assert not (tmp_path / "outside").exists() and not (tmp_path / "torch_home").exists()


@pytest.mark.e2e
@pytest.mark.slow
def test_a_killed_trial_in_a_received_study_reruns_with_values_of_the_search_space_only(
    tmp_path,
):
    """The study database is a file of the sweep folder: a trial it records as running is
    relaunched with its parameters for this command's search space, nothing more."""
    from optuna.distributions import CategoricalDistribution, LogUniformDistribution
    from optuna.trial import TrialState, create_trial

    from repro.extras.search.study import open_study

    sweep, marker = tmp_path / "sweep", tmp_path / "marker"
    sweep.mkdir()
    study = open_study(f"sqlite:///{sweep}/optuna.db", "lr_wd", direction="maximize")
    planted = {"+callbacks.x._target_": "pathlib.Path.touch", "+callbacks.x._args_": f"[{marker}]"}
    study.add_trial(
        create_trial(
            state=TrialState.RUNNING,
            params={"optimizer.lr": 0.1, "optimizer.weight_decay": 1e-4, **planted},
            distributions={
                "optimizer.lr": LogUniformDistribution(0.01, 1.0),
                "optimizer.weight_decay": LogUniformDistribution(1e-5, 1e-2),
                **{key: CategoricalDistribution([value]) for key, value in planted.items()},
            },
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "repro.train", "-m", "hparams_search=lr_wd",
         "hydra.sweeper.n_trials=1", *tiny("trainer.num_threads=1"), f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert not marker.exists()
    (trial,) = open_study(f"sqlite:///{sweep}/optuna.db", "lr_wd").trials
    assert trial.state == TrialState.COMPLETE
    overrides = yaml.safe_load((sweep / "0" / ".hydra" / "overrides.yaml").read_text())
    assert not [o for o in overrides if "callbacks.x" in o]


def test_where_a_relaunch_writes_is_resumes_to_say_never_the_records():
    recorded = {"job": {"config_name": "config"}, "overrides": {"hydra": ["hydra.mode=RUN"]}}
    task = ["++hydra.run.dir=/elsewhere", "hydra.sweep.dir=/elsewhere", "trainer.epochs=2"]
    relaunch = recorded_overrides.checked_relaunch(recorded, task, None, Path("record"), False)
    assert relaunch.task == ["trainer.epochs=2"] and relaunch.hydra == []


# --- the recorded-override rules, word for word (fast: the checks alone) ---


@pytest.mark.parametrize("key", ["data.root", "data.endpoint_url", "data.cache_dir"])
def test_a_recorded_place_is_refused_unless_this_command_line_gives_it(key):
    recorded = ["seed.value=1", f"{key}=theirs"]
    with pytest.raises(UntrustedConfigError) as refused:
        recorded_overrides.placed(recorded, {}, "rec", trusted=False)
    assert str(refused.value) == (
        f"rec: the record sets {key} ({recorded_overrides.PLACES[key]}), refused: a record "
        "never chooses where a run reads, connects or writes; give it on this command line: "
        f"python -m repro.resume PATH {key}=VALUE"
    )
    mine = recorded_overrides.placed(recorded, {key: "mine"}, "rec", trusted=False)
    assert mine == ["seed.value=1", f"{key}=mine"]
    assert recorded_overrides.placed(recorded, {}, "rec", trusted=True) == recorded


def test_a_recorded_option_that_downloads_needs_the_command_line_to_say_so():
    run = recorded_overrides.Relaunch("config", [], ["data=cifar10"], None)
    composed = recorded_overrides.check_composes(run, run.task, Path("rec"))
    with pytest.raises(UntrustedConfigError, match=r"data=cifar10 downloads by default"):
        recorded_overrides.check_network(composed, {}, "rec", trusted=False)
    recorded_overrides.check_network(composed, {"data.download": "false"}, "rec", False)
    plain = recorded_overrides.check_composes(run._replace(task=[]), [], Path("rec"))
    recorded_overrides.check_network(plain, {}, "rec", trusted=False)  # synthetic: offline


SAYS = " a run folder decides values of the run's own keys only. If you made this folder, or "
SAYS += "trust whoever did, add trust=true"
WHY = {
    "instantiate": "it names a key Hydra's instantiate reads (_target_, _args_ ...): code to run",
    "interpolation": "it holds an interpolation, whose resolver would run",
    "hydra": "a Hydra setting, which decides what runs and where files go",
    "key": "a key of the run's config is a dotted name: no package (@), path or group path",
    "option": "a config group's option is a name in this checkout's conf/, not a path",
    "tracker": "it says where the run's metrics are sent",
}


@pytest.mark.parametrize(
    ("override", "why"),
    [
        ("+callbacks.x._target_=os.system", "instantiate"),
        ("trainer.tta=x${oc.env:HOME}", "interpolation"),
        ("hydra=x", "hydra"),
        ("hydra.job.name=abc", "hydra"),
        ("hydra/launcher=../x", "hydra"),
        ("+model@hydra.callbacks=x", "key"),
        ("model..x=1", "key"),
        ("model=../evil", "option"),
        ("logger.mlflow.tracking_uri=file:///x", "tracker"),
        ("logger.wandb.entity=someone", "tracker"),
    ],
)
def test_each_refused_override_says_why_in_one_line(override, why):
    with pytest.raises(UntrustedConfigError) as refused:
        recorded_overrides.check([override], "record")
    assert str(refused.value) == (
        f"record: the recorded override {override!r} is refused: {WHY[why]};{SAYS}"
    )


@pytest.mark.parametrize("override", ["data.download=true", "data.root=/x", "X.y=1"])
def test_a_place_or_a_key_of_any_first_letter_passes_the_value_check(override):
    # Places are refused by `placed`, which knows what this command line gives.
    assert recorded_overrides.check([override], "record") == [override]


@pytest.mark.parametrize("overrides", ["trainer.epochs=2", [1], None])
def test_overrides_that_are_not_a_list_of_strings_are_refused_as_such(overrides):
    with pytest.raises(UntrustedConfigError) as refused:
        recorded_overrides.check(overrides, "record")
    assert str(refused.value) == "record: its overrides are not a list of key=value strings"


def _relaunch(task, env=None, trusted=False, **job):
    recorded = {"job": {"config_name": "config", **job},
                "overrides": {"hydra": ["hydra.mode=MULTIRUN", "hydra/launcher=joblib"]}}  # fmt: skip
    return recorded_overrides.checked_relaunch(recorded, task, env, Path("rec"), trusted)


@pytest.mark.parametrize("seed", ["random", "0", "100", str(2**32 - 1), 7])
def test_a_relaunch_keeps_the_launcher_and_the_values_and_a_valid_hash_seed(seed):
    relaunch = _relaunch(["seed.value=3", "hydra.sweep.dir=/a=b"], {"pythonhashseed": seed})
    assert relaunch == ("config", ["hydra/launcher=joblib"], ["seed.value=3"], str(seed))
    assert _relaunch(["seed.value=3"]).hash_seed is None  # none recorded: none set


@pytest.mark.parametrize("seed", [str(2**32), "12a", "-1", "random "])
def test_a_hash_seed_python_would_refuse_is_one_line(seed):
    with pytest.raises(DataError) as refused:
        _relaunch([], {"pythonhashseed": seed})
    assert str(refused.value) == f"rec: recorded hash seed {seed!r} is not random or a number"


def test_a_relaunchs_refusals_name_the_record_and_trust_lifts_the_value_rule_only():
    with pytest.raises(UntrustedConfigError, match=r"^rec: the recorded override 'hydra\.job"):
        _relaunch(["hydra.job.name=x"])
    with pytest.raises(UntrustedConfigError, match=r"^rec: the recorded override '\+callbacks"):
        recorded_overrides.checked_relaunch(
            {"job": {}, "overrides": {"hydra": ["+callbacks.x._target_=os.system"]}}, [], None,
            Path("rec"), False,
        )  # fmt: skip
    trusted = _relaunch(["+callbacks.x._target_=mine.Callback"], trusted=True)
    assert trusted.task == ["+callbacks.x._target_=mine.Callback"]
    vouched = recorded_overrides.checked_relaunch(
        {"job": {}, "overrides": {"hydra": ["hydra.job.name=mine"]}}, [], None, Path("rec"), True
    )  # the record's own Hydra settings too, when the user vouches for it
    assert vouched.hydra == ["hydra.job.name=mine"]
    with pytest.raises(UntrustedConfigError) as named:
        _relaunch([], config_name="bench")
    assert str(named.value) == (
        "rec: the recorded config name 'bench' is refused: repro.train's config is 'config' "
        "(conf/config.yaml), and a run folder decides values only; if you made this folder, "
        "or trust whoever did, add trust=true"
    )
    with pytest.raises(DataError) as odd:
        _relaunch([], trusted=True, config_name="../x")
    assert str(odd.value) == "rec: config name '../x' is not a file name of conf/"
    with pytest.raises(DataError) as missing:
        _relaunch([], trusted=True, config_name="nothing_here")
    assert str(missing.value) == (
        "rec: config name 'nothing_here': this checkout has no conf/nothing_here.yaml"
    )


def test_a_relaunch_is_composed_here_first_and_a_misfit_is_its_first_line():
    fits = _relaunch(["trainer.epochs=1"])
    recorded_overrides.check_composes(fits, ["trainer.epochs=1"], Path("rec"))
    with pytest.raises(DataError) as misfit:
        recorded_overrides.check_composes(fits, ["trainer.epoch=1"], Path("rec"))
    said = str(misfit.value)
    assert said.startswith("rec: its overrides do not compose in this checkout: ")
    assert "trainer.epoch" in said and "\n" not in said
    launcher = fits._replace(hydra=["hydra/launcher=no_such_launcher"])
    with pytest.raises(DataError, match="no_such_launcher"):
        recorded_overrides.check_composes(launcher, [], Path("rec"))


def test_a_stored_config_keeps_no_server_cache_or_download_of_its_own():
    stored = {
        "data": {
            "_target_": "repro.shards.dataset.shards",
            "root": "s3://bucket/data",
            "endpoint_url": "http://their.host:9000",
            "cache_dir": "/home/user/.ssh",
            "download": True,
        }
    }
    data = trust.as_data(stored, "ckpt")["data"]
    assert (data["endpoint_url"], data["cache_dir"], data["download"]) == (None, None, False)
    assert stored["data"]["endpoint_url"] == "http://their.host:9000"  # the record is untouched
