"""Writing files (repro.core.files) in-process: the rename that makes a write whole, the opening
that refuses links, FIFOs and second names, and the helpers around them."""

from __future__ import annotations

import errno
import json
import os
import re

import pytest

from repro.core import files
from repro.core.errors import StorageError


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_refusal_of_the_file_system_becomes_one_storage_error_naming_the_file(tmp_path):
    target = tmp_path / "summary.json"
    with pytest.raises(StorageError) as refused, files.writing(target):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert str(target) in str(refused.value) and "No space left" in str(refused.value)
    assert refused.value.__cause__ is None and refused.value.__suppress_context__
    with pytest.raises(ValueError), files.writing(target):
        raise ValueError("not the file system's")


def test_a_write_aside_replaces_the_file_only_when_the_block_ends(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("old")
    with files.atomic_path(target) as aside:
        assert aside.parent == tmp_path
        assert re.fullmatch(rf"\.summary\.json\.{os.getpid()}\.[0-9a-f]{{8}}\.tmp", aside.name)
        aside.write_text("new")
        assert target.read_text() == "old"
    assert target.read_text() == "new" and sorted(os.listdir(tmp_path)) == ["summary.json"]


def test_a_block_that_fails_leaves_the_file_and_no_trace(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), files.atomic_path(target) as aside:
        aside.write_text("half")
        raise RuntimeError("killed")
    assert target.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["summary.json"]
    with pytest.raises(StorageError), files.atomic_path(tmp_path / "gone" / "x") as aside:
        aside.write_text("no folder to write in")


def test_a_link_planted_under_the_aside_name_is_removed_not_written_through(tmp_path, monkeypatch):
    outside = tmp_path / "outside.txt"
    outside.write_text("someone else's")
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setattr(files.secrets, "token_hex", lambda size: "ab" * size)
    (run / f".metrics.csv.{os.getpid()}.abababab.tmp").symlink_to(outside)
    files.write_text_atomic(run / "metrics.csv", "step\n")
    assert outside.read_text() == "someone else's"
    assert (run / "metrics.csv").read_text() == "step\n" and not (run / "metrics.csv").is_symlink()


def test_each_write_aside_has_a_name_of_its_own(tmp_path):
    with files.atomic_path(tmp_path / "a") as first, files.atomic_path(tmp_path / "a") as second:
        assert first != second
        first.write_text("1")
        second.write_text("2")
    assert (tmp_path / "a").read_text() == "1", "the outer block ends last"


def test_appending_in_place_keeps_what_is_there(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("first\n")
    with files.open_in_place(log) as handle:
        handle.write("second\n")
        assert os.get_blocking(handle.fileno())
    assert log.read_text() == "first\nsecond\n"
    with files.open_in_place(log, "ab") as handle:
        handle.write(b"third\n")
    assert log.read_bytes() == b"first\nsecond\nthird\n"
    fresh = tmp_path / "metrics.csv"
    with files.open_in_place(fresh, newline="\r\n") as handle:
        handle.write("step\n")
    assert fresh.read_bytes() == b"step\r\n"
    assert fresh.stat().st_mode & 0o777 == 0o644 & ~current_umask()


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_overwriting_in_place_truncates_only_after_the_checks(tmp_path):
    state = tmp_path / ".attempts.reserve"
    state.write_bytes(b"0123456789")
    with files.open_in_place(state, "wb") as handle:
        handle.write(b"ab")
    assert state.read_bytes() == b"ab"
    os.link(state, tmp_path / "second-name")
    with pytest.raises(OSError) as refused:
        files.open_in_place(state, "wb")
    assert str(refused.value) == (
        f"[Errno 1] not a regular file, or a file with another hard link: refused: '{state}'"
    )
    assert state.read_bytes() == b"ab", "nothing truncated"
    fresh = tmp_path / "emptied"
    fresh.write_bytes(b"0123")
    files.open_in_place(fresh, "wb").close()
    assert fresh.read_bytes() == b"", "truncated to nothing, even with nothing written"


def test_a_link_a_fifo_and_a_second_name_are_refused_leaving_no_descriptor(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("kept")
    (tmp_path / "linked.log").symlink_to(outside)
    os.mkfifo(tmp_path / "fifo.log")
    (tmp_path / "named.log").write_text("x")
    os.link(tmp_path / "named.log", tmp_path / "other-name")
    before = open_descriptors()
    with pytest.raises(OSError) as linked:
        files.open_in_place(tmp_path / "linked.log")
    assert linked.value.errno == errno.ELOOP
    with pytest.raises(OSError) as fifo:
        files.open_in_place(tmp_path / "fifo.log")  # no reader: refused at once
    assert fifo.value.errno == errno.ENXIO
    with pytest.raises(OSError, match="another hard link"):
        files.open_in_place(tmp_path / "named.log")
    assert open_descriptors() == before
    assert outside.read_text() == "kept"


def test_a_fifo_with_a_reader_is_refused_as_no_regular_file(tmp_path):
    fifo = tmp_path / "train.log"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(OSError, match="not a regular file"):
            files.open_in_place(fifo)
    finally:
        os.close(reader)


@pytest.mark.parametrize(
    ("text", "whole"),
    [("a\nb\n", "a\nb\n"), ("a\nb\nc", "a\nb\n"), ("torn", ""), ("", ""), ("\n", "\n")],
)
def test_a_torn_last_line_is_dropped(text, whole):
    assert files.complete_lines(text) == whole


def test_json_records_are_indented_sorted_and_end_with_a_newline(tmp_path):
    payload = {"b": [1, 2], "a": {"y": 1, "x": "é"}}
    text = files.json_text(payload)
    assert text == json.dumps(payload, indent=2, sort_keys=True) + "\n"
    assert text.index('"a"') < text.index('"b"') and text.endswith("}\n")
    files.write_json_atomic(tmp_path / "summary.json", payload)
    assert (tmp_path / "summary.json").read_text() == text


def test_appends_from_two_handles_all_land_at_the_end(tmp_path):
    log = tmp_path / "attempts.jsonl"
    first = files.open_in_place(log, "ab")
    second = files.open_in_place(log, "ab")
    for handle, data in ((first, b"1"), (second, b"2"), (first, b"3")):
        handle.write(data)
        handle.flush()
    first.close()
    second.close()
    assert log.read_bytes() == b"123", "each write goes where the file ends now"
