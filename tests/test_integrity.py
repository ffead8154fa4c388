"""Bit rot is found, not trained on: every checkpoint carries a digest of its content, a
damaged one is refused naming the file, and a resume falls back to the newest intact one."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import torch

from repro.core.errors import CheckpointError
from repro.core.runs import checkpoint, integrity
from repro.core.runs.checkpoint import Checkpointer, DamagedCheckpointError
from repro.evaluate import evaluate_checkpoint

from conftest import tiny, train_in_process

RUN = tiny("trainer.epochs=2", "trainer.checkpoint_every_steps=2", "trainer.keep_checkpoints=3")


def tensor_spans(path: Path) -> list[tuple[int, int]]:
    """(first byte, length) of every tensor's data inside a torch.save archive."""
    spans = []
    with zipfile.ZipFile(path) as archive, path.open("rb") as handle:
        for info in archive.infolist():
            if "/data/" not in info.filename or info.file_size == 0:
                continue
            handle.seek(info.header_offset + 26)  # the local header's name and extra lengths
            name_length, extra_length = (int.from_bytes(handle.read(2), "little") for _ in "ab")
            spans.append((info.header_offset + 30 + name_length + extra_length, info.file_size))
    return spans


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def _saved(folder: Path, step: int) -> Path:
    writer = Checkpointer(folder, keep=5)
    weights = torch.arange(4096, dtype=torch.float32).reshape(64, 64) + step
    state = {"model": {"w": weights, "b": torch.ones(64, dtype=torch.bfloat16)}}
    state |= {"position": {"step": step}, "note": ("plain", 1.5, None)}
    path = writer.save(state, step)
    writer.wait()
    return path


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("tensor", [0, 1])
def test_a_flipped_byte_in_any_tensor_is_refused_naming_the_file(tensor, where, tmp_path):
    path = _saved(tmp_path, 3)
    assert checkpoint.load(path)["position"]["step"] == 3  # intact: loads
    start, length = sorted(tensor_spans(path), key=lambda span: -span[1])[tensor]
    offset = {"first": start, "middle": start + length // 2, "last": start + length - 1}[where]
    flip_byte(path, offset)
    with pytest.raises(DamagedCheckpointError, match=rf"{path.name}: damaged"):
        checkpoint.load(path)


def test_the_digest_covers_plain_values_too():
    state = {"position": {"step": 3}, "rng": ("MT", [1, 2], 0.5)}
    sealed = integrity.sealed(state)
    assert integrity.intact(sealed)
    assert not integrity.intact({**sealed, "position": {"step": 4}})
    assert not integrity.intact({**sealed, "rng": ("MT", [1, 2], 0.25)})
    assert not integrity.intact(state)  # no digest: not intact


def test_auto_resume_falls_back_past_damaged_files_and_names_them(tmp_path):
    folder = tmp_path / "checkpoints"
    for step in (2, 4):
        _saved(folder, step)
    newest = folder / "step-00000004.pt"
    start, _ = tensor_spans(newest)[0]
    flip_byte(newest, start + 5)  # last.pt is the same file (a hard link)
    skipped: list[str] = []
    path, state = Checkpointer(folder, keep=5).latest_good(skipped)
    assert path.name == "step-00000002.pt" and state["position"]["step"] == 2
    assert [message.split(":")[0] for message in skipped] == [
        str(folder / "last.pt"),
        str(newest),
    ]


def test_with_no_intact_checkpoint_left_auto_resume_refuses_in_one_line(tmp_path):
    folder = tmp_path / "checkpoints"
    path = _saved(folder, 2)
    flip_byte(path, tensor_spans(path)[0][0])
    with pytest.raises(CheckpointError, match=r"no usable checkpoint in .*damaged") as refused:
        Checkpointer(folder, keep=5).latest_good()
    assert "\n" not in str(refused.value)


def test_a_resume_past_a_rotten_last_pt_ends_on_the_uninterrupted_weights(tmp_path):
    straight = train_in_process(tmp_path / "straight", *RUN)
    run_dir = tmp_path / "run"
    train_in_process(run_dir, *RUN, "trainer.halt_at_step=8")
    last = run_dir / "checkpoints" / "last.pt"
    start, length = max(tensor_spans(last), key=lambda span: span[1])
    flip_byte(last, start + length // 3)

    resumed = train_in_process(run_dir, *RUN)
    assert resumed["resumed_from_step"] == 6  # step 8's file is last.pt: both damaged
    assert resumed["weights_sha256"] == straight["weights_sha256"]
    attempt = json.loads((run_dir / "attempts.jsonl").read_text().splitlines()[-1])
    assert attempt["resumed_from"] == "checkpoints/step-00000006.pt"
    assert len(attempt["skipped_checkpoints"]) == 2
    assert all("damaged" in reason for reason in attempt["skipped_checkpoints"])


def test_evaluate_refuses_a_damaged_checkpoint(tmp_path):
    train_in_process(tmp_path, *tiny("trainer.max_steps=2"))
    best = tmp_path / "checkpoints" / "best.pt"
    flip_byte(best, tensor_spans(best)[0][0])
    with pytest.raises(DamagedCheckpointError, match=r"best\.pt: damaged"):
        evaluate_checkpoint(best)


def test_init_weights_refuses_a_damaged_checkpoint_of_ours(tmp_path):
    train_in_process(tmp_path / "trained", *tiny("trainer.max_steps=2"))
    last = tmp_path / "trained" / "checkpoints" / "last.pt"
    flip_byte(last, tensor_spans(last)[0][0])
    with pytest.raises(CheckpointError, match=r"init_weights=.*last\.pt: damaged"):
        train_in_process(tmp_path / "tuned", *tiny(f"trainer.init_weights={last}"))


# ---- the unit: what the digest covers (fast, in-process) -----------------------------------


def test_the_digest_covers_every_key_not_only_the_values():
    weights = {"fc.weight": torch.ones(2, 3), "fc.bias": torch.zeros(2)}
    state = integrity.sealed({"model": weights, "step": 3})
    renamed = {"fc.wfight": weights["fc.weight"], "fc.bias": weights["fc.bias"]}
    assert not integrity.intact({**state, "model": renamed})
    assert not integrity.intact({**{k: v for k, v in state.items() if k != "step"}, "stop": 3})
    assert integrity.intact(state)


def test_the_digest_covers_order_dtype_shape_and_type():
    base = integrity.content_sha256({"a": torch.arange(6.0), "b": 1})
    swapped = integrity.content_sha256({"b": 1, "a": torch.arange(6.0)})
    half = integrity.content_sha256({"a": torch.arange(6.0).half(), "b": 1})
    shaped = integrity.content_sha256({"a": torch.arange(6.0).reshape(2, 3), "b": 1})
    typed = integrity.content_sha256({"a": torch.arange(6.0), "b": 1.0})
    listed = integrity.content_sha256({"a": torch.arange(6.0), "b": [1, 2]})
    tupled = integrity.content_sha256({"a": torch.arange(6.0), "b": (1, 2)})
    assert len({base, swapped, half, shaped, typed, listed, tupled}) == 7
    assert integrity.content_sha256({"a": torch.arange(6.0), "b": 1}) == base
