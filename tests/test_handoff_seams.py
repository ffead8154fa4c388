"""Promises kept by a hand-off between modules, asserted at the seam with exact values: what
preflight hands the loop (the model and the generators exactly as it found them), and what the
boundary (guards/received.py) returns to its callers: the record as written, and a refusal
that each caller turns into what its docstring says (a failed job naming why, no recorded
choice, an error), never into a silent default read from elsewhere."""

from __future__ import annotations

import json

import pytest
import torch

from repro.core import build, restore
from repro.core.engine import assembly, preflight
from repro.core.guards import received
from repro.core.runs.history import RunHistory
from repro.core.runtime.distributed import Context
from repro.core.sweeps import report

from conftest import compose_config, tiny

SEED = 11
SMALL = tiny("data.train_size=64", "data.val_size=32", "data.test_size=32", "model.dropout=0.5")


def _handed_to_the_loop(monkeypatch, checked: bool):
    """The parts the loop starts from, and the generator's state once they are built."""
    if not checked:
        monkeypatch.setattr(preflight, "check_classes", lambda *args, **kwargs: None)
    cfg = compose_config(*SMALL)
    knobs = assembly.apply_knobs(cfg, Context())
    torch.manual_seed(SEED)  # the process's generator, which a careless probe would draw from
    parts = assembly.build_parts(cfg, knobs, SEED, build.splits(cfg, SEED))
    return parts, torch.get_rng_state()


def test_preflight_hands_the_loop_the_model_and_the_generator_as_it_found_them(monkeypatch):
    calls = []
    checked_by = preflight.check_classes
    monkeypatch.setattr(
        preflight, "check_classes", lambda *a, **k: calls.append(a) or checked_by(*a, **k)
    )
    parts, generator = _handed_to_the_loop(monkeypatch, checked=True)
    assert len(calls) == 1  # preflight ran on this build
    monkeypatch.undo()
    unchecked, unchecked_generator = _handed_to_the_loop(monkeypatch, checked=False)
    assert torch.equal(generator, unchecked_generator)
    assert parts.model.training and unchecked.model.training  # dropout and batch norm train
    assert all(module.training for module in parts.model.modules())
    ours, theirs = parts.model.state_dict(), unchecked.model.state_dict()
    assert list(ours) == list(theirs)
    for name, tensor in ours.items():
        assert tensor.device == theirs[name].device and tensor.dtype == theirs[name].dtype
        assert torch.equal(tensor, theirs[name]), name  # weights and running statistics
    assert parts.total_steps == unchecked.total_steps


def _job(sweep, name="0", summary=None, overrides="- seed=0\n- lr=${oc.env:HOME}\n"):
    folder = sweep / name
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(overrides)
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    return folder


SUMMARY = {"completed": True, "step": 7, "val_acc": 0.1 + 0.2, "note": "é", "big": 2**62 + 1}


def test_a_sweep_jobs_records_reach_the_report_exactly_as_written(tmp_path):
    job = report.read_job(_job(tmp_path / "sweep", summary=SUMMARY))
    # The resolver stays text: nothing received is resolved by OmegaConf.
    assert job.overrides == ["seed=0", "lr=${oc.env:HOME}"]
    assert job.summary == SUMMARY and job.summary["val_acc"] == 0.1 + 0.2
    assert job.error is None and job.ok


def test_a_refused_record_fails_its_job_with_the_boundarys_reason_not_the_report(tmp_path):
    sweep = tmp_path / "sweep"
    folder = _job(sweep)
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps(SUMMARY))
    (folder / "summary.json").symlink_to(outside)
    job = report.read_job(folder)
    assert (job.overrides, job.summary) == ([], None)  # nothing read through the link
    assert job.error == "records unreadable: a symbolic link: files from others are read as " + (
        "they are, not through links; put a copy of its target in its place"
    )
    not_a_list = report.read_job(_job(sweep, "1", SUMMARY, overrides="seed: 0\n"))
    assert (
        not_a_list.error == "records unreadable: .hydra/overrides.yaml holds no list of overrides"
    )
    assert not_a_list.summary is None


@pytest.mark.parametrize(
    "written, said",
    [
        ({"test_weights": "ema"}, "ema"),
        ({"test_weights": "best"}, "best"),
        ({"test_weights": "../../elsewhere"}, None),  # a value outside the choices says nothing
        (["test_weights", "ema"], None),  # no mapping
    ],
)
def test_a_runs_recorded_test_weights_are_taken_only_from_the_choices(tmp_path, written, said):
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps(written))
    assert restore._recorded_test_weights(summary) == said


def test_a_refused_summary_records_no_choice_of_test_weights(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "summary.json").write_text(json.dumps({"test_weights": "ema"}))
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").symlink_to(tmp_path / "elsewhere" / "summary.json")
    assert restore._recorded_test_weights(run / "summary.json") is None


def test_a_runs_attempts_come_back_line_by_line_and_a_refused_table_is_an_error(tmp_path):
    history = RunHistory(tmp_path)
    rows = [{"attempt": 1, "result": "running", "value": 0.1 + 0.2}, {"attempt": 2, "x": [1]}]
    history.path.write_text("".join(json.dumps(row) + "\n" for row in rows) + "\n")
    assert history.attempts() == rows
    history.path.unlink()
    assert history.attempts() == []
    outside = tmp_path.parent / f"{tmp_path.name}-attempts.jsonl"
    outside.write_text(json.dumps(rows[0]) + "\n")
    history.path.symlink_to(outside)
    with pytest.raises(received.ReceivedFileError, match="a symbolic link"):
        history.attempts()
