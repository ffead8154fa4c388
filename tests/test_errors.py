"""Bad input stops the run before training with one clear message, a non-zero exit, no traceback."""

from __future__ import annotations

import pytest

from conftest import run_cli, tiny

CASES = {
    "unknown group option": (["amp=fp61"], ["amp/fp61", "auto", "bf16", "off"]),
    "wrong type": (["trainer.epochs=abc"], ["trainer.epochs", "abc", "Integer"]),
    "unknown key": (["trainer.epoch=3"], ["trainer.epoch", "not in"]),
    "batch size 0": (["trainer.batch_size=0"], ["trainer.batch_size=0", ">= 1"]),
    "negative learning rate": (["optimizer.lr=-0.1"], ["optimizer.lr=-0.1", ">= 0"]),
    "unknown device": (["trainer.device=tpu"], ["trainer.device='tpu'", "auto, cpu, cuda"]),
    "missing imagefolder": (
        ["data=imagefolder", "data.root=/no/such/folder"],
        ["data.root=/no/such/folder", "expected a folder holding train/"],
    ),
    "fp16 on cpu": (["amp=fp16", "trainer.device=cpu"], ["amp='fp16'", "allowed here: off"]),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_clear_message(case, tmp_path):
    overrides, expected = CASES[case]
    run_dir = tmp_path / "run"
    done = run_cli("repro.train", *tiny(*overrides), f"hydra.run.dir={run_dir}")
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "Traceback" not in output
    for text in expected:
        assert text in output, f"{text!r} not in:\n{output}"
    assert not (run_dir / "checkpoints").exists(), "no training work may happen"


def test_config_errors_keep_earlier_results(tmp_path):
    run_dir = tmp_path / "run"
    assert run_cli("repro.train", *tiny(), f"hydra.run.dir={run_dir}").returncode == 0
    summary = (run_dir / "summary.json").read_text()
    done = run_cli("repro.train", *tiny("optimizer.lr=-1"), f"hydra.run.dir={run_dir}")
    assert done.returncode == 2
    assert (run_dir / "summary.json").read_text() == summary
    assert (run_dir / "checkpoints" / "last.pt").exists()
