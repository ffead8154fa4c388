"""trainer.init_weights: a run started from another run's weights (fine-tuning)."""

from __future__ import annotations

import hashlib

import pytest
import torch

from repro.core import build
from repro.core.errors import CheckpointError
from repro.core.runs.init_weights import load_matching, load_on_every_rank
from repro.core.runtime import distributed
from repro.extras.models.small_cnn import SmallCNN

from conftest import Exploit, compose_config, save_as_from_a_gpu, tiny, train_in_process


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
    said = {
        unsafe: "refused, not tensors saved by torch.save, or it holds other objects (loading "
        "them could run code)",
        foreign: "none of its 1 tensors matches a name and shape of this model; point it at "
        "weights of the same architecture",
        numbered: "not a state_dict (a dict of tensors by name)",
        truncated: "not a torch.save file (RuntimeError)",
    }
    for path, message in said.items():  # each names the setting and the file, word for word
        with pytest.raises(CheckpointError) as refused_file:
            load_matching(model, path)
        assert str(refused_file.value) == f"trainer.init_weights={path}: {message}"


def test_code_in_a_file_is_refused_even_where_torchs_own_default_is_switched_off(
    tmp_path, monkeypatch
):
    """weights_only=True is passed, not left to torch's default, which this variable turns off."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    unsafe = tmp_path / "unsafe.pt"
    torch.save({"w": Exploit(tmp_path / "pwned")}, unsafe)
    with pytest.raises(CheckpointError, match="refused"):
        load_matching(SmallCNN(num_classes=3, widths=(8, 16)), unsafe)
    assert not (tmp_path / "pwned").exists()


def test_weights_saved_on_a_gpu_load_on_a_machine_without_one(trained, tmp_path):
    source = torch.load(trained, weights_only=True)["model"]
    from_gpu = tmp_path / "from_gpu.pt"
    save_as_from_a_gpu(source, from_gpu)
    with pytest.raises(RuntimeError, match="gpu_elsewhere"):
        torch.load(from_gpu, weights_only=True)  # torch's own default: the saved device
    model = build.model(compose_config(*tiny()), 5)
    assert load_matching(model, from_gpu)["loaded"] == len(source)


def test_a_damaged_repro_checkpoint_is_refused_as_one(trained, tmp_path):
    state = torch.load(trained, weights_only=True)
    name = next(iter(state["model"]))
    state["model"][name] = state["model"][name] + 1  # bit rot: the digest no longer matches
    damaged = tmp_path / "damaged.pt"
    torch.save(state, damaged)
    with pytest.raises(CheckpointError) as refused:
        load_matching(build.model(compose_config(*tiny()), 0), damaged)
    assert str(refused.value).startswith(f"trainer.init_weights={damaged}: damaged, ")


def test_a_wrappers_prefix_is_dropped_only_when_every_name_has_it(trained, tmp_path):
    source = torch.load(trained, weights_only=True)["model"]
    first, *rest = source
    mixed = {f"module.{first}": source[first], **{name: source[name] for name in rest}}
    path = tmp_path / "mixed.pt"
    torch.save(mixed, path)
    model = build.model(compose_config(*tiny()), 5)
    loaded = load_matching(model, path)
    assert loaded["loaded"] == len(rest) and loaded["kept_initial"] == [first]
    compiled = tmp_path / "compiled_ddp.pt"  # DDP around torch.compile: both prefixes
    torch.save({f"module._orig_mod.{name}": t for name, t in source.items()}, compiled)
    assert load_matching(model, compiled)["loaded"] == len(source)


def test_the_tensors_kept_initial_are_logged_by_name(trained, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="repro.core.runs.init_weights")
    load_matching(SmallCNN(num_classes=3, widths=(8, 16)), trained)
    (said,) = [r.getMessage() for r in caplog.records if r.name == "repro.core.runs.init_weights"]
    count = len(torch.load(trained, weights_only=True)["model"]) - 2
    assert (
        said == f"init_weights: {count} tensors loaded; kept initial: 9.bias, 9.weight"
    )  # the head


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
    gone = trained.parent / "gone.pt"  # now rank 0 is the one without the file
    with pytest.raises(CheckpointError) as refused:
        load_on_every_rank(model, gone, two_ranks)
    assert str(refused.value) == f"rank 0: trainer.init_weights={gone}: no such file"
    monkeypatch.undo()
    with pytest.raises(CheckpointError) as refused:  # one process: no rank to name
        load_on_every_rank(model, gone, distributed.Context())
    assert str(refused.value) == f"trainer.init_weights={gone}: no such file"
