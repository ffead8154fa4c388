"""A checkpoint or run folder from someone else runs no code: a stored config builds only the
targets this checkout trusts, unless the user says trust=true."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from repro.core.errors import CheckpointError
from repro.core.runs import checkpoint
from repro.core.runs.trust import UntrustedConfigError
from repro.evaluate import evaluate_checkpoint
from repro.predict import predict_files
from repro.verify.command import verify

from conftest import ROOT, make_image_tree, run_cli, tiny, train_in_process

RUN = tiny("trainer.max_steps=2", "model.widths=[8,16]")
HARMFUL = (
    "pathlib.Path.touch",
    "pathlib.Path.write_text",
    "torch.hub.load",
    "importlib.import_module",
)
PLACES = ("model", "optimizer", "scheduler", "augment.transforms")


def _poisoned(config: dict, place: str, target: str, marker: Path) -> dict:
    """`config` with `place` replaced by a call of `target` that would create `marker`."""
    node = {"_target_": target, "_args_": [str(marker)]}
    if target == "pathlib.Path.write_text":
        node["_args_"].append("written")
    if place == "augment.transforms":
        config["augment"]["transforms"] = [node]
    else:
        config[place] = node
    return config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    train_in_process(run_dir, *RUN)
    return run_dir


def _crafted_checkpoint(trained: Path, folder: Path, place: str, target: str, marker: Path):
    state = checkpoint.load(trained / "checkpoints" / "last.pt")  # plain values and tensors
    _poisoned(state["config"], place, target, marker)
    path = folder / "crafted.pt"
    checkpoint.atomic_save(state, path)  # loads under weights_only=True, digest intact
    return path


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("target", HARMFUL)
def test_evaluate_predict_and_verify_refuse_a_harmful_target_and_create_nothing(
    target, place, trained, tmp_path
):
    marker = tmp_path / "created-by-the-config"
    ckpt = _crafted_checkpoint(trained, tmp_path, place, target, marker)
    expected = rf"crafted\.pt: .*{target.replace('.', '[.]')}.* trust=true"
    with pytest.raises(UntrustedConfigError, match=expected):
        evaluate_checkpoint(ckpt)
    with pytest.raises(UntrustedConfigError, match=expected):
        predict_files(ckpt, trained / "summary.json")  # refused before the images are looked at

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    recorded = _poisoned(yaml.safe_load((run_dir / "resolved_config.yaml").read_text()),
                         place, target, marker)  # fmt: skip
    (run_dir / "resolved_config.yaml").write_text(yaml.safe_dump(recorded))
    with pytest.raises(UntrustedConfigError, match=r"resolved_config\.yaml: .* trust=true"):
        verify(run_dir)
    assert not marker.exists()


def test_an_interpolation_in_a_stored_config_is_refused_before_it_resolves(trained, tmp_path):
    state = checkpoint.load(trained / "checkpoints" / "last.pt")
    claimed = tmp_path / "claimed"
    state["config"]["trainer"]["tta"] = f"${{record_subdir:{claimed}}}"  # would make a folder
    checkpoint.atomic_save(state, tmp_path / "crafted.pt")
    with pytest.raises(UntrustedConfigError, match=r"trainer\.tta=.* interpolation"):
        evaluate_checkpoint(tmp_path / "crafted.pt")
    assert not claimed.exists()


def test_a_resume_builds_from_the_users_config_never_the_checkpoints(tmp_path):
    run_dir, marker = tmp_path / "run", tmp_path / "created-by-the-config"
    train_in_process(run_dir, *RUN, "trainer.halt_at_step=1")
    for path in (run_dir / "checkpoints").glob("step-*.pt"):
        state = checkpoint.load(path)
        _poisoned(state["config"], "model", HARMFUL[0], marker)
        path.unlink()  # last.pt is a hard link to it: write a new file
        checkpoint.atomic_save(state, path)
    (run_dir / "checkpoints" / "last.pt").unlink()
    with pytest.raises(CheckpointError, match=r"differs from the checkpoint's .*model\._target_"):
        train_in_process(run_dir, *RUN)
    assert not marker.exists()


def test_a_colleagues_model_needs_trust_and_then_works(tmp_path):
    run_dir = tmp_path / "run"
    small = [o for o in tiny("trainer.max_steps=2") if not o.startswith("model.")]
    train_in_process(run_dir, *small, "model=torchvision", "model._target_=colleague_nets.tiny_net")
    ckpt = run_dir / "checkpoints" / "last.pt"
    with pytest.raises(UntrustedConfigError, match=r"colleague_nets\.tiny_net"):
        evaluate_checkpoint(ckpt)
    assert evaluate_checkpoint(ckpt, trust=True)["images"] == 128
    images = make_image_tree(tmp_path / "images", 1, classes=("circle",), side=32)
    assert len(predict_files(ckpt, images, trust=True)) == 2
    assert verify(run_dir, steps=2, trust=True).identical


@pytest.mark.e2e
@pytest.mark.slow
def test_the_entry_points_refuse_in_one_line(trained, tmp_path):
    marker = tmp_path / "created-by-the-config"
    ckpt = _crafted_checkpoint(trained, tmp_path, "model", "pathlib.Path.touch", marker)
    evaluated = run_cli("repro.evaluate", f"ckpt={ckpt}")
    predicted = run_cli("repro.predict", f"ckpt={ckpt}", f"images={ROOT / 'README.md'}",
                        f"out={tmp_path / 'p.csv'}")  # fmt: skip
    for done in (evaluated, predicted):
        assert done.returncode == 2
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith(f"error: {ckpt}: model._target_='pathlib.Path.touch' is not")
    assert not marker.exists() and not (tmp_path / "p.csv").exists()


# ---- the unit: what counts as an interpolation (fast, in-process) --------------------------


# ---- the unit: the check, word for word, and where each kind of target is trusted ----------
