"""What `repro.verify` says, in-process without a rerun (repro.verify.command): the
environment's and the data's differences, a summary read as data, and the refusals that come
before any step. test_verify.py reruns real runs."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from repro.core import build
from repro.core.data import fingerprint
from repro.core.errors import ConfigError, DataError, UserError
from repro.core.runs.fingerprint_log import FingerprintLog
from repro.core.runtime import determinism, environment
from repro.verify import command
from repro.verify.command import Verdict

from conftest import compose_config, tiny


def test_a_verdict_is_identical_only_without_a_divergence():
    assert Verdict(5).identical and not Verdict(5, divergence="step 3").identical
    assert Verdict(0).environment == [] and Verdict(0).data == []


def test_environment_changes_name_each_key_those_changing_results_first():
    recorded = {"torch": "2.4", "python": "3.11", "packages": {"rich": "13"}, "num_threads": 2}
    current = {"torch": "2.5", "python": "3.12", "packages": {"rich": "14"}, "cuda": "12.4"}
    assert command.environment_changes(recorded, current) == [
        "cuda: None recorded, '12.4' now (changes floating-point results)",
        "num_threads: 2 recorded, None now (changes floating-point results)",
        "torch: '2.4' recorded, '2.5' now (changes floating-point results)",
        "packages.rich: '13' recorded, '14' now",
        "python: '3.11' recorded, '3.12' now",
    ]
    assert command.environment_changes(recorded, recorded) == []


def test_a_nested_key_that_changes_results_is_marked_by_its_last_part():
    changes = command.environment_changes(
        {"gpu": {"device_name": "A"}}, {"gpu": {"device_name": "B"}}
    )
    assert changes == ["gpu.device_name: 'A' recorded, 'B' now (changes floating-point results)"]


SPLITS = {
    "train": {"images": 10, "sha256": "a" * 64},
    "val": {"images": 2, "sha256": "b" * 64},
}


def test_the_same_data_digest_has_no_changes():
    same = {"sha256": "x", "splits": SPLITS, "classes": ["a"]}
    assert command.data_changes(same, {**same, "splits": {}}) == []


def test_each_split_that_differs_is_named_with_its_count_and_digest():
    recorded = {"sha256": "x", "splits": SPLITS, "classes": ["a", "b"]}
    now = {
        "train": SPLITS["train"],
        "val": {"images": 3, "sha256": "c" * 64},
        "test": {"images": 1, "sha256": "d" * 64},
    }
    assert command.data_changes(
        recorded, {"sha256": "y", "splits": now, "classes": ["a", "b"]}
    ) == [
        f"val: 2 images {'b' * 12} recorded, 3 images {'c' * 12} now",
        f"test: None images None recorded, 1 images {'d' * 12} now",
    ]


def test_with_every_split_alike_the_classes_are_what_differs():
    recorded = {"sha256": "x", "splits": SPLITS, "classes": ["a", "b"]}
    now = {"sha256": "y", "splits": SPLITS, "classes": ["b", "a"]}
    assert command.data_changes(recorded, now) == ["classes: ['a', 'b'] recorded, ['b', 'a'] now"]


def test_a_missing_summary_is_empty_and_a_wrong_one_is_one_line(tmp_path):
    assert command._summary(tmp_path / "summary.json") == {}
    path = tmp_path / "summary.json"
    path.write_text(
        json.dumps({"env": {}, "flags": {}, "weights_sha256": "ab", "data": {"splits": {}}})
    )
    assert command._summary(path)["weights_sha256"] == "ab"
    for payload, said in [
        ([1, 2], "not a summary repro can read (no mapping)"),
        ({"env": [], "flags": 3}, "not a summary repro can read (env, flags malformed)"),
        ({"weights_sha256": 5}, "(weights_sha256 malformed)"),
        ({"data": {"splits": {"train": 3}}}, "(data malformed)"),
        ({"data": {"splits": []}}, "(data malformed)"),
        ({"data": 4}, "(data malformed)"),
    ]:
        path.write_text(json.dumps(payload))
        with pytest.raises(DataError) as refused:
            command._summary(path)
        assert str(refused.value).startswith(f"{path}: ") and str(refused.value).endswith(said)


def test_a_linked_summary_is_read_through_the_boundary_and_refused(tmp_path):
    (tmp_path / "elsewhere.json").write_text("{}")
    (tmp_path / "summary.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(Exception, match="a symbolic link"):
        command._summary(tmp_path / "summary.json")


def run_folder(tmp_path, fingerprints: str | None = "1,0.5,\n2,0.25,abc\n"):
    run = tmp_path / "run"
    run.mkdir()
    (run / "resolved_config.yaml").write_text("seed: {value: 0}\n")
    if fingerprints is not None:
        (run / "fingerprints.csv").write_text(fingerprints)
    return run


def test_a_folder_without_the_records_is_no_run(tmp_path):
    run = run_folder(tmp_path, fingerprints=None)
    with pytest.raises(DataError) as refused:
        command.verify(run)
    assert str(refused.value) == (
        f"{run}: not a run folder (needs resolved_config.yaml, fingerprints.csv)"
    )


def test_an_empty_fingerprint_log_recorded_no_step(tmp_path):
    run = run_folder(tmp_path, fingerprints="")
    with pytest.raises(DataError, match=r"fingerprints\.csv: empty, the run recorded no step$"):
        command.verify(run)


def test_more_steps_than_the_run_recorded_are_refused_before_anything_is_built(tmp_path):
    run = run_folder(tmp_path)
    with pytest.raises(ConfigError) as refused:
        command.verify(run, steps=3)
    assert str(refused.value) == "steps=3 is not allowed: at most the 2 steps the run recorded"


def test_a_fingerprint_log_that_is_none_is_one_line(tmp_path):
    run = run_folder(tmp_path, fingerprints="step,loss\nnot,a,number\n")
    with pytest.raises(DataError) as refused:
        command.verify(run)
    assert str(refused.value).startswith(f"{run / 'fingerprints.csv'}: not a fingerprint log (")


# ---- verify() and the command, with the rerun's training stood in for ----------------------
# What a rerun is compared with and how: the training itself is test_verify.py's.

ROWS = [1.5, 1.25, 1.0, 0.75]  # the recorded run's four steps (its last one hashed)


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """A run folder as a finished tiny run leaves it, and a rerun that trains nothing: it
    writes `rerun["losses"]` as its fingerprints and returns `rerun["weights"]`."""
    cfg = compose_config(*tiny("trainer.num_threads=2"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "resolved_config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    FingerprintLog.of_run(run_dir).append(1, ROWS, "ab" * 32)
    env = environment.describe(torch.device("cpu")) | {"num_threads": 2}
    data = fingerprint.fingerprint(build.splits(cfg, 0), None)
    summary = {"env": env, "flags": determinism.snapshot(), "weights_sha256": "w" * 64}
    (run_dir / "summary.json").write_text(json.dumps(summary | {"completed": True, "data": data}))
    rerun = {"losses": ROWS, "weights": "w" * 64, "configs": []}

    def train(cfg, work):
        rerun["configs"].append(cfg)
        rerun["work"] = work
        FingerprintLog.of_run(work).append(1, rerun["losses"], "ab" * 32)
        return {"weights_sha256": rerun["weights"]}

    monkeypatch.setattr(command, "train", train)
    return run_dir, rerun


def edit_summary(run_dir, **changes):
    path = run_dir / "summary.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def test_an_untouched_run_reruns_its_recorded_config_and_is_identical(recorded):
    run_dir, rerun = recorded
    verdict = command.verify(run_dir)
    assert verdict == Verdict(steps_compared=4)
    (cfg,) = rerun["configs"]
    assert cfg.trainer.halt_at_step is None and cfg.trainer.resume == "never"
    assert cfg.seed.mode == "fixed" and cfg.seed.value == 0 and cfg.data.download is False
    assert cfg.logger.plot is False and cfg.logger.tensorboard is False
    assert cfg.trainer.num_threads == 2
    assert command.verify(run_dir, steps=2, threads=3, download=True).steps_compared == 4
    asked = rerun["configs"][-1]
    assert asked.trainer.halt_at_step == 2 and asked.trainer.num_threads == 3
    assert asked.data.download is True


def test_the_thread_count_is_the_recorded_one_else_the_configs(recorded):
    run_dir, rerun = recorded
    summary = json.loads((run_dir / "summary.json").read_text())
    edit_summary(run_dir, env={k: v for k, v in summary["env"].items() if k != "num_threads"})
    command.verify(run_dir)
    assert rerun["configs"][-1].trainer.num_threads == 2  # the recorded config's own
    (run_dir / "summary.json").unlink()  # no summary: no environment to compare, nor data
    verdict = command.verify(run_dir)
    assert verdict == Verdict(steps_compared=4) and rerun["configs"][-1].trainer.num_threads == 2


def test_the_first_step_that_differs_is_named_and_only_whole_reruns_compare_the_weights(
    recorded,
):
    run_dir, rerun = recorded
    rerun["losses"] = [1.5, 1.25, 1.125, 0.75]
    assert command.verify(run_dir).divergence == "step 3: loss 1.0 recorded, 1.125 now"
    rerun["losses"], rerun["weights"] = ROWS, "v" * 64
    assert command.verify(run_dir).divergence == (
        "final weights_sha256 differs although every step matched"
    )
    assert command.verify(run_dir, steps=4).identical  # part of a run: its weights are not the end
    edit_summary(run_dir, completed=False)  # halted: its weights are not the end either
    assert command.verify(run_dir).identical
    rerun["losses"] = ROWS[:2]  # a rerun that stopped early compares the steps it has
    assert command.verify(run_dir).steps_compared == 2


def test_other_flags_are_environment_changes_and_other_data_stops_before_training(recorded):
    run_dir, rerun = recorded
    summary = json.loads((run_dir / "summary.json").read_text())
    edit_summary(run_dir, flags={**summary["flags"], "cudnn_benchmark": "was on"})
    verdict = command.verify(run_dir)
    assert verdict.identical and len(verdict.environment) == 1
    assert verdict.environment[0].startswith("cudnn_benchmark: 'was on' recorded, ")
    data = summary["data"] | {"sha256": "0" * 64}
    data["splits"] = {**data["splits"], "val": {"images": 7, "sha256": "1" * 64}}
    edit_summary(run_dir, data=data)
    trained = len(rerun["configs"])
    verdict = command.verify(run_dir)
    assert verdict.divergence == "the data, before any step (nothing was trained)"
    now = summary["data"]["splits"]["val"]["sha256"][:12]
    assert verdict.data == [f"val: 7 images {'1' * 12} recorded, 128 images {now} now"]
    assert len(rerun["configs"]) == trained and verdict.steps_compared == 0


@pytest.mark.parametrize(
    "argv, said",
    [
        ([], "error: RUN_DIR=None is not allowed: usage: python -m repro.verify RUN_DIR"),
        (["steps=3"], "error: RUN_DIR=None is not allowed: usage: "),
        (["run", "steps=0"], "error: steps='0' is not allowed: only steps=N and threads=N"),
        (["run", "threads=x"], "error: threads='x' is not allowed: only steps=N"),
        (["run", "seed=1"], "error: seed='1' is not allowed: only steps=N"),
        (["run", "trust=yes"], "error: trust='yes' is not allowed: only steps=N"),
    ],
)
def test_the_commands_arguments_are_refused_in_one_line(argv, said, capsys):
    with pytest.raises(SystemExit) as stopped:
        command.main(argv)
    assert stopped.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(said)


def test_the_command_prints_each_difference_then_its_verdict(monkeypatch, capsys, tmp_path):
    asked = []

    def verdict_of(run_dir, steps, threads, trust, download):
        asked.append((run_dir, steps, threads, trust, download))
        return verdicts.pop(0)

    monkeypatch.setattr(command, "verify", verdict_of)
    verdicts = [
        Verdict(5, environment=["python: '3.10' recorded, '3.11' now"]),
        Verdict(0, "the data, before any step", data=["val: 1 images \x1b[31m"]),
    ]
    with pytest.raises(SystemExit) as stopped:
        command.main([str(tmp_path), "steps=5", "threads=2", "trust=true", "download=false"])
    assert stopped.value.code == 0
    assert asked == [(tmp_path, 5, 2, True, False)]
    assert capsys.readouterr().out.splitlines() == [
        f"re-running {tmp_path} (first 5 steps) ...",
        "environment differs: python: '3.10' recorded, '3.11' now",
        "identical: 5 steps, every loss and weights hash matches",
    ]
    with pytest.raises(SystemExit) as stopped:
        command.main([str(tmp_path), "download=true"])
    assert stopped.value.code == 1 and asked[-1] == (tmp_path, None, None, False, True)
    assert capsys.readouterr().out.splitlines() == [
        f"re-running {tmp_path} (all steps) ...",
        "data differs: val: 1 images \\x1b[31m",
        "diverged at the data, before any step",
    ]


def edit_config(run_dir, key: str, value) -> None:
    path = run_dir / "resolved_config.yaml"
    cfg = OmegaConf.load(path)
    OmegaConf.update(cfg, key, value, force_add=True)
    path.write_text(OmegaConf.to_yaml(cfg))


def test_the_recorded_thread_count_wins_over_the_configs_and_is_compared_as_rerun(recorded):
    run_dir, rerun = recorded
    summary = json.loads((run_dir / "summary.json").read_text())
    edit_summary(run_dir, env={**summary["env"], "num_threads": 3})  # the config says 2
    verdict = command.verify(run_dir)
    assert rerun["configs"][-1].trainer.num_threads == 3 and verdict.environment == []
    edit_config(run_dir, "trainer.num_threads", None)  # recorded without a count: the machine's
    edit_summary(run_dir, env={k: v for k, v in summary["env"].items() if k != "num_threads"})
    verdict = command.verify(run_dir)
    assert rerun["configs"][-1].trainer.num_threads is None
    threads = torch.get_num_threads()
    marked = "(changes floating-point results)"
    assert verdict.environment == [f"num_threads: None recorded, {threads} now {marked}"]
    assert rerun["work"].name.startswith("repro-verify-")  # a scratch folder of its own


def test_a_summary_without_an_environment_or_flags_is_compared_key_by_key(recorded):
    run_dir, _ = recorded
    summary = json.loads((run_dir / "summary.json").read_text())
    edit_summary(run_dir, flags={**summary["flags"], "deterministic": "was"}, env={})
    verdict = command.verify(run_dir)
    assert any(line.startswith("python: None recorded") for line in verdict.environment)
    assert any(line.startswith("deterministic: 'was' recorded") for line in verdict.environment)
    (run_dir / "summary.json").write_text(
        json.dumps({"completed": True, "weights_sha256": "w" * 64})
    )
    verdict = command.verify(run_dir)
    assert verdict.identical and all(" recorded, " in line for line in verdict.environment)
    assert any(line.startswith("cudnn_benchmark: None recorded") for line in verdict.environment)


def test_more_steps_than_recorded_are_refused_naming_the_last_recorded_step(recorded):
    run_dir, _ = recorded
    with pytest.raises(ConfigError) as refused:
        command.verify(run_dir, steps=9)
    assert str(refused.value) == "steps=9 is not allowed: at most the 4 steps the run recorded"


def test_a_recorded_config_is_checked_as_data_and_against_the_template(recorded):
    run_dir, rerun = recorded
    resolved = run_dir / "resolved_config.yaml"
    cfg = command._recorded_config(resolved, None, None, {})
    assert cfg.data.download is False and cfg.trainer.num_threads == 2
    edit_config(run_dir, "trainer.epochs", "two")
    with pytest.raises(DataError) as refused:
        command.verify(run_dir)
    assert str(refused.value).startswith(f"{resolved}: not a config of this template (")
    assert "epochs" in str(refused.value)
    edit_config(run_dir, "trainer.epochs", 1)
    edit_config(run_dir, "model._target_", "os.system")  # a target this checkout does not know
    for call in (
        lambda: command.verify(run_dir),
        lambda: command._recorded_config(resolved, None, None, {}),
    ):
        with pytest.raises(UserError) as refused:
            call()
        assert str(refused.value).startswith(f"{resolved}") and "os.system" in str(refused.value)
    assert rerun["configs"] == []


def test_a_nested_key_is_marked_by_its_last_part_and_lines_keep_the_keys_order():
    lines = command.environment_changes(
        {"a": 1, "a.b": 1, "x": {"y": {"cpu_capability": "AVX2"}}},
        {"a": 2, "a.b": 2, "x": {"y": {"cpu_capability": "AVX512"}}},
    )
    assert lines == [
        "x.y.cpu_capability: 'AVX2' recorded, 'AVX512' now (changes floating-point results)",
        "a: 1 recorded, 2 now",
        "a.b: 1 recorded, 2 now",
    ]


def test_recorded_data_without_its_splits_names_each_split_now():
    now = {"sha256": "1", "splits": {"train": {"images": 2, "sha256": "a" * 64}}, "classes": 3}
    assert command.data_changes({"sha256": "0"}, now) == [
        f"train: None images None recorded, 2 images {'a' * 12} now"
    ]


@pytest.mark.parametrize(
    "argv, asked",
    [
        (["run"], ("run", None, None, False, False)),
        (["run", "steps=1"], ("run", 1, None, False, False)),
        (["run", "trust=true", "steps=5", "download=true"], ("run", 5, None, True, True)),
    ],
)
def test_the_commands_options_reach_verify_and_downloads_stay_off_unless_asked(
    argv, asked, monkeypatch, capsys
):
    given, gates = [], []

    @contextlib.contextmanager
    def offline(why, allowed=False):
        gates.append((why, allowed))
        yield

    monkeypatch.setattr(command, "offline", offline)
    monkeypatch.setattr(
        command, "verify", lambda *args, **kw: given.append((*args, *kw.values())) or Verdict(1)
    )
    with pytest.raises(SystemExit):
        command.main(argv)
    assert given == [(Path(asked[0]), *asked[1:])]
    assert gates == [("the config comes from run", asked[-1])]


def test_an_option_with_a_second_equals_sign_is_refused_as_written(capsys):
    with pytest.raises(SystemExit):
        command.main(["run", "steps=3=4"])
    assert capsys.readouterr().err.startswith("error: steps='3=4' is not allowed: ")
