"""Bad input stops the run before training with one clear message, a non-zero exit, no traceback."""

from __future__ import annotations

import pytest

from repro import config

from conftest import compose_config, run_cli, tiny

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
    "misspelt added key": (["+trainer.epocs=3"], ["trainer.epocs=3", "closest is trainer.epochs"]),
    "misspelt added section": (["+trainr.epochs=3"], ["trainr=", "closest is trainer"]),
    "model outputs other than the classes": (
        ["model.num_classes=5"],
        ["gives 5 outputs per image but the data has 10 classes"],
    ),
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


def test_keys_added_to_free_form_nodes_are_accepted():
    # Arguments of the class a `_target_` names: the schema cannot know them.
    cfg = compose_config(*tiny("+optimizer.dampening=0.0", "+model.extra=1"))
    config.validate(cfg)
    assert cfg.optimizer.dampening == 0.0


@pytest.mark.parametrize("mode", ["run", "sweep"])
def test_an_output_folder_that_cannot_be_made_is_one_line(mode, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    if mode == "run":
        done = run_cli("repro.train", *tiny(), f"hydra.run.dir={blocker}/run")
        key = "hydra.run.dir"
    else:
        done = run_cli("repro.train", "-m", *tiny("seed=0,1"), f"hydra.sweep.dir={blocker}/sweep")
        key = "hydra.sweep.dir"
    assert done.returncode == 2
    assert "Traceback" not in done.stderr + done.stdout
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert errors == [
        f"error: cannot write the output folder {blocker}/{mode} (Not a directory): "
        f"set {key} to one you can"
    ]
    assert blocker.read_text() == "not a folder\n"
