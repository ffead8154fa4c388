"""trainer.init_weights: a run started from another run's weights (fine-tuning)."""

from __future__ import annotations

import hashlib
import os
import shlex

import pytest
import torch

from repro import build
from repro.errors import CheckpointError
from repro.models.small_cnn import SmallCNN
from repro.runs.init_weights import load_matching, load_on_every_rank
from repro.runtime import distributed

from conftest import compose_config, tiny, train_in_process


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("source")
    train_in_process(run_dir, *tiny())
    return run_dir / "checkpoints" / "last.pt"


def test_every_matching_tensor_is_copied_and_a_new_head_keeps_its_initial_values(trained):
    source = torch.load(trained, weights_only=True)["model"]
    same = build.model(compose_config(*tiny()), 5)  # another seed: other initial values
    loaded = load_matching(same, trained)
    assert loaded["kept_initial"] == [] and loaded["loaded"] == len(source)
    assert all(torch.equal(same.state_dict()[name], source[name]) for name in source)
    assert loaded["sha256"] == hashlib.sha256(trained.read_bytes()).hexdigest()

    three_classes = SmallCNN(num_classes=3, widths=(8, 16))
    own = three_classes.state_dict()
    head = {name: t.clone() for name, t in own.items() if t.shape != source[name].shape}
    loaded = load_matching(three_classes, trained)
    assert len(head) == 2 and loaded["kept_initial"] == sorted(head)  # the linear layer's
    for name, tensor in three_classes.state_dict().items():
        expected = head[name] if name in head else source[name]
        assert torch.equal(tensor, expected), name


def test_a_plain_state_dict_saved_from_ddp_loads_too(trained, tmp_path):
    source = torch.load(trained, weights_only=True)["model"]
    plain = tmp_path / "weights.pt"
    torch.save({f"module.{name}": tensor for name, tensor in source.items()}, plain)
    model = build.model(compose_config(*tiny()), 5)
    assert load_matching(model, plain)["loaded"] == len(source)


class Exploit:
    """Unpickling this runs a command that creates `marker`."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (shlex.join(["touch", self.marker]),))


def test_files_that_cannot_start_a_model_are_refused_in_one_line(trained, tmp_path):
    model = build.model(compose_config(*tiny()), 0)
    unsafe = tmp_path / "unsafe.pt"
    torch.save({"w": Exploit(tmp_path / "pwned")}, unsafe)
    foreign = tmp_path / "foreign.pt"
    torch.save({"encoder.weight": torch.zeros(3, 3)}, foreign)
    text = tmp_path / "notes.yaml"
    text.write_text("weights: none\n")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(trained.read_bytes()[:2000])
    numbered = tmp_path / "numbered.pt"
    torch.save({0: torch.zeros(1)}, numbered)
    refused = [
        (tmp_path / "missing.pt", "no such file"),
        (tmp_path, "not a file"),
        (unsafe, "refused"),
        (foreign, "none of its 1 tensors"),
        (text, "not tensors saved by torch.save"),
        (truncated, "not a torch.save file"),
        (numbered, "not a state_dict"),
    ]
    for path, message in refused:
        with pytest.raises(CheckpointError, match=message):
            load_matching(model, path)
    assert not (tmp_path / "pwned").exists()


def test_a_fine_tuned_run_records_its_start_and_resumes_exactly(trained, tmp_path):
    run = tiny("trainer.epochs=2", f"trainer.init_weights={trained}")
    straight = train_in_process(tmp_path / "straight", *run)
    assert straight["init_weights"]["sha256"] == hashlib.sha256(trained.read_bytes()).hexdigest()
    scratch = train_in_process(tmp_path / "scratch", *tiny("trainer.epochs=2"))
    assert straight["weights_sha256"] != scratch["weights_sha256"]
    assert straight["val_acc"] >= scratch["val_acc"]  # it starts where a trained run ended
    moved = tmp_path / "moved.pt"
    moved.write_bytes(trained.read_bytes())
    run = tiny("trainer.epochs=2", f"trainer.init_weights={moved}")
    train_in_process(tmp_path / "resumed", *run, "trainer.halt_at_step=7")
    moved.unlink()  # a resume takes its weights, and the record, from its checkpoint
    resumed = train_in_process(tmp_path / "resumed", *run)
    assert resumed["resumed_from_step"] == 7
    assert resumed["weights_sha256"] == straight["weights_sha256"]
    assert resumed["init_weights"]["sha256"] == straight["init_weights"]["sha256"]
    assert resumed["init_weights"]["path"] == str(moved.resolve())


def test_a_file_missing_on_one_rank_stops_every_rank(trained, monkeypatch):
    model = build.model(compose_config(*tiny()), 0)
    two_ranks = distributed.Context(rank=0, world=2, local_rank=0)
    # Rank 0 reads the file; rank 1 (another node) does not find it.
    others = ["trainer.init_weights=/node2/last.pt: no such file"]
    monkeypatch.setattr(distributed, "gather", lambda value, dist: [value, *others])
    with pytest.raises(CheckpointError, match=r"rank 1: .*no such file"):
        load_on_every_rank(model, trained, two_ranks)
    others[0] = None
    assert load_on_every_rank(model, trained, two_ranks)["loaded"] > 0
