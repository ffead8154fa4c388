"""skeleton's own parts against the engine's promises: every data option of conf/data/ (a new
YAML there is checked without a test of its own), and the default config's exact resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import repro.train  # registers the engine's schema and resolvers
from hydra import compose, initialize_config_dir
from repro import build
from repro.runs import resume

CONF = Path(__file__).resolve().parents[1] / "conf"
DATA_OPTIONS = sorted(path.stem for path in (CONF / "data").glob("*.yaml"))
# A few steps on a few images, with an evaluation and a checkpoint every 2 steps.
QUICK = [
    "debug=fast", "trainer.max_steps=4", "trainer.eval_every_steps=2",
    "trainer.checkpoint_every_steps=2", "trainer.save_checkpoints=true",
]  # fmt: skip


def config(*overrides: str) -> Any:
    """The config as `make train ARGS="..."` composes it: this conf/, then the engine's."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[*QUICK, *overrides])


def train(run_dir: Path, *overrides: str) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    return repro.train.train(config(*overrides), run_dir)


@pytest.mark.parametrize("option", DATA_OPTIONS)
def test_a_data_option_gives_the_same_split_for_the_same_seed(option):
    cfg = config(f"data={option}")
    first, again = (resume.split_digests(build.splits(cfg, 7)) for _ in range(2))
    assert first == again, f"data={option}: the same seed gave another split or other items"


@pytest.mark.parametrize("option", DATA_OPTIONS)
def test_a_data_option_trains_the_same_weights_with_0_and_2_workers(option, tmp_path):
    weights = {
        workers: train(tmp_path / str(workers), f"data={option}",
                       f"dataloader.num_workers={workers}")["weights_sha256"]
        for workers in (0, 2)
    }  # fmt: skip
    assert weights[0] == weights[2], (
        f"data={option}: 0 and 2 loader workers trained different weights: an item must be "
        "the same in every process and call (no draws from a global generator, no state)"
    )


def test_the_default_config_resumes_bit_for_bit_after_a_stop(tmp_path):
    straight = train(tmp_path / "straight")
    train(tmp_path / "stopped", "trainer.halt_at_step=2")  # checkpointed, then stops
    resumed = train(tmp_path / "stopped")
    assert resumed["weights_sha256"] == straight["weights_sha256"]
    confusion = [
        json.loads((tmp_path / r / "confusion.json").read_text()) for r in ("straight", "stopped")
    ]
    assert confusion[0] == confusion[1]  # the callback's state came back with the checkpoint
