"""What `repro.verify` says, in-process without a rerun (repro.verify.command): the
environment's and the data's differences, a summary read as data, and the refusals that come
before any step. test_verify.py reruns real runs."""

from __future__ import annotations

import json

import pytest

from repro.errors import ConfigError, DataError
from repro.verify import command
from repro.verify.command import Verdict


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
