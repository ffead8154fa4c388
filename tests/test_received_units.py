"""The boundary itself (repro.core.guards.received), in-process on files made here: each check of
a received file, each parser's caps, the image header readers, and the words of every refusal.
test_received_boundary.py has the entry points refusing such files."""

from __future__ import annotations

import io
import json
import os
import socket
import struct

import pytest
import torch
from PIL import Image

from repro.core.guards import received
from repro.core.guards.received import ReceivedFileError


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def run(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "summary.json").write_text('{"step": 3}\n')
    (tmp_path / "elsewhere.txt").write_text("someone else's\n")
    return folder


def refusal(path, kind="record", root=None) -> str:
    before = open_descriptors()
    with pytest.raises(ReceivedFileError) as refused:
        received.open_file(path, kind, root)
    assert open_descriptors() == before, "no descriptor left open"
    return str(refused.value)


# ---- opening ------------------------------------------------------------------------------


def test_a_regular_file_inside_its_folder_is_read(run):
    with received.opened(run / "summary.json", "record", run) as handle:
        assert handle.read() == b'{"step": 3}\n'
        handle.seek(2)
        assert handle.tell() == 2 and handle.read(4) == b"step"
        assert os.get_blocking(handle.fileno())
    assert received.read_bytes(run / "summary.json", "record") == b'{"step": 3}\n'


def test_a_missing_file_and_a_link_are_refused_by_name(run, tmp_path):
    assert refusal(run / "gone.json") == f"{run / 'gone.json'}: no such file"
    (run / "linked.json").symlink_to(tmp_path / "elsewhere.txt")
    assert refusal(run / "linked.json") == (
        f"{run / 'linked.json'}: a symbolic link: files from others are read as they are, not "
        "through links; put a copy of its target in its place"
    )


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda path: path.mkdir(), "a folder, not a regular file: refused"),
        (
            os.mkfifo,
            "a FIFO, not a regular file: refused, reading it could wait or never end",
        ),
    ],
)
def test_anything_but_a_regular_file_is_refused_without_waiting(run, make, said):
    make(run / "odd")
    assert refusal(run / "odd") == f"{run / 'odd'}: {said}"


def test_a_device_is_refused_not_read():
    assert refusal("/dev/zero", root="/dev") == (
        "/dev/zero: a character device, not a regular file: refused, reading it could wait or "
        "never end"
    )


def test_a_socket_cannot_be_opened_and_says_why(run):
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(run / "socket"))
        assert refusal(run / "socket").startswith(f"{run / 'socket'}: cannot be read (")
    finally:
        server.close()


def test_a_file_reached_through_a_linked_folder_lies_outside_the_root(run, tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.yaml").write_text("a: 1\n")
    (run / ".hydra").symlink_to(tmp_path / "other")
    path = run / ".hydra" / "config.yaml"
    real = os.path.realpath(tmp_path / "other" / "config.yaml")
    assert refusal(path, root=run) == (
        f"{path}: lies outside {os.path.realpath(run)} once its links are followed ({real}): "
        "refused"
    )
    assert received.read_text(path) == "a: 1\n", "without a root: its own folder"


def test_a_second_name_inside_the_folder_is_read_one_outside_is_refused(run, tmp_path):
    os.link(run / "summary.json", run / "copy.json")
    assert received.read_text(run / "summary.json", root=run) == '{"step": 3}\n'
    os.link(run / "summary.json", tmp_path / "outside.json")
    assert refusal(run / "summary.json", root=run) == (
        f"{run / 'summary.json'}: has a hard link outside its folder: refused, it is another "
        "file's contents; replace it by a copy of its own"
    )
    for kind in received.LINKED_KINDS:  # images and shards are hard-linked by design
        assert received.read_bytes(run / "summary.json", kind, root=run)


def test_a_file_larger_than_its_kind_allows_is_refused_before_a_byte_is_read(run, monkeypatch):
    monkeypatch.setitem(received.SIZE_LIMITS, "record", 11)
    assert refusal(run / "summary.json") == (
        f"{run / 'summary.json'}: 12 bytes, more than a record file may hold (11 bytes)"
    )
    monkeypatch.setitem(received.SIZE_LIMITS, "record", 12)
    assert received.read_bytes(run / "summary.json", "record") == b'{"step": 3}\n'


def test_a_file_that_grows_while_read_is_stopped_at_its_limit(run, monkeypatch):
    monkeypatch.setitem(received.SIZE_LIMITS, "table", 20)
    table = run / "metrics.csv"
    table.write_bytes(b"x" * 20)
    with received.opened(table, "table") as handle:
        with open(table, "ab") as grower:
            grower.write(b"y" * 100)
        with pytest.raises(ReceivedFileError) as refused:
            handle.read()
    assert str(refused.value) == f"{table}: grew past what a table file may hold"


def test_where_no_proc_names_the_descriptor_its_real_path_must_be_the_same_file(run, monkeypatch):
    def no_proc(self):
        raise OSError("no /proc here")

    monkeypatch.setattr(received.Path, "readlink", no_proc)
    assert received.read_text(run / "summary.json", root=run) == '{"step": 3}\n'
    monkeypatch.setattr(received.os.path, "samestat", lambda first, second: False)
    assert refusal(run / "summary.json") == (
        f"{run / 'summary.json'}: changed while it was opened: refused"
    )


def test_every_name_of_a_file_under_a_folder_is_counted(run, tmp_path):
    os.link(run / "summary.json", run / "one")
    (run / "deep").mkdir()
    os.link(run / "summary.json", run / "deep" / "two")
    os.link(run / "summary.json", tmp_path / "three")
    (run / "dangling").symlink_to(tmp_path / "nothing")
    info = os.stat(run / "summary.json")
    assert received._links_inside(run, info) == 3 and info.st_nlink == 4


# ---- text, YAML and JSON ------------------------------------------------------------------


def test_text_must_be_utf8(run):
    (run / "latin.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ReceivedFileError, match=r"latin\.txt: not UTF-8 text$"):
        received.read_text(run / "latin.txt")


def test_yaml_is_plain_data_its_resolvers_kept_as_text(run):
    (run / "overrides.yaml").write_text("- seed=${oc.env:HOME}\n- x: [1, 2]\n")
    assert received.load_yaml(run / "overrides.yaml", run) == ["seed=${oc.env:HOME}", {"x": [1, 2]}]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "a: !!python/object/apply:os.system ['true']\n",
            "not valid YAML at line 1 (could not determine a constructor for the tag "
            "'tag:yaml.org,2002:python/object/apply:os.system')",
        ),
        ("a: [1, 2\n", "not valid YAML at line 2 (did not find expected ',' or ']')"),
        ("a: b: c\n", "not valid YAML at line 1 (mapping values are not allowed in this context)"),
        ("a: *nope\n", "not valid YAML at line 1 (found undefined alias)"),
    ],
)
def test_yaml_with_tags_or_damage_is_one_line_naming_its_line_and_problem(text, said):
    with pytest.raises(ReceivedFileError) as refused:
        received.parse_yaml(text, "config.yaml")
    assert str(refused.value) == f"config.yaml: {said}"


def nested_yaml(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_yaml_nested_past_the_cap_is_refused_before_it_is_built():
    assert received.parse_yaml(nested_yaml(received.MAX_DEPTH), "x") is not None
    with pytest.raises(ReceivedFileError, match=r"^x: nested deeper than 64 levels: refused$"):
        received.parse_yaml(nested_yaml(received.MAX_DEPTH + 1), "x")


def test_yaml_aliases_count_as_the_nodes_they_repeat(monkeypatch):
    monkeypatch.setattr(received, "MAX_NODES", 40)
    # a: 4 values (the list and its three), b: the list of three aliases of a: 1 + 3 * 4 = 13.
    text = "a: &a [1, 2, 3]\nb: &b [*a, *a, *a]\nc: [*b, *b]\n"
    with pytest.raises(ReceivedFileError) as refused:
        received.parse_yaml(text, "x")
    assert str(refused.value) == (
        "x: more than 40 values (an alias counted as the node it repeats): refused"
    )
    monkeypatch.setattr(received, "MAX_NODES", 60)
    assert received.parse_yaml(text, "x")["c"][1][2] == [1, 2, 3]
    scalar = "s: &s word\nt: [*s, *s]\n"
    monkeypatch.setattr(received, "MAX_NODES", 7)  # mapping 1 + s 1 + word 1 + t 1 + list 1 + 2
    assert received.parse_yaml(scalar, "x") == {"s": "word", "t": ["word", "word"]}


def test_json_records_are_plain_data_and_damage_is_one_line(run):
    (run / "a.json").write_text('{"x": [1, 2.5, "é"]}')
    assert received.load_json(run / "a.json", root=run) == {"x": [1, 2.5, "é"]}
    with pytest.raises(ReceivedFileError) as refused:
        received.parse_json('{"x": }', "a.json")
    assert str(refused.value) == "a.json: not valid JSON (Expecting value at line 1 column 7)"
    with pytest.raises(ReceivedFileError, match=r"^a\.json: not valid JSON \(not UTF-8 text\)$"):
        received.parse_json(b"\xff\xfe{", "a.json")
    with pytest.raises(ReceivedFileError, match=r"^a\.json: nested too deep$"):
        received.parse_json("[" * 200_000 + "]" * 200_000, "a.json")
    with pytest.raises(ReceivedFileError, match="nested deeper than 64"):
        received.parse_json("[" * 70 + "]" * 70, "a.json")


# ---- the shape of parsed data -------------------------------------------------------------


def nested(depth: int):
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def test_nesting_up_to_the_cap_passes_and_one_level_more_is_refused():
    received.check_shape(nested(received.MAX_DEPTH), "x")
    with pytest.raises(ReceivedFileError, match=r"^x: nested deeper than 64 levels: refused$"):
        received.check_shape(nested(received.MAX_DEPTH + 1), "x")
    deep_dict: dict = {}
    for _ in range(received.MAX_DEPTH + 1):
        deep_dict = {"k": deep_dict}
    with pytest.raises(ReceivedFileError):
        received.check_shape(deep_dict, "x")


@pytest.mark.parametrize("kind", [list, tuple, set, frozenset])
def test_every_collection_counts_its_values(monkeypatch, kind):
    monkeypatch.setattr(received, "MAX_NODES", 6)
    received.check_shape(kind(range(5)), "x")  # the collection and its five
    with pytest.raises(ReceivedFileError) as refused:
        received.check_shape(kind(range(6)), "x")
    assert str(refused.value) == (
        "x: more than 6 values (shared references counted at each use): refused"
    )


def test_a_mappings_keys_and_values_both_count(monkeypatch):
    monkeypatch.setattr(received, "MAX_NODES", 5)
    received.check_shape({"a": 1, "b": 2}, "x")
    with pytest.raises(ReceivedFileError):
        received.check_shape({"a": 1, "b": 2, "c": 3}, "x")


# ---- checkpoints --------------------------------------------------------------------------


def test_a_checkpoint_loads_as_weights_only_data_mapped_or_read(run):
    state = {"model": {"w": torch.arange(4.0)}, "step": 3}
    torch.save(state, run / "last.pt")
    for mmap in (False, True):
        loaded = received.load_checkpoint(run / "last.pt", run, mmap=mmap)
        assert loaded["step"] == 3 and torch.equal(loaded["model"]["w"], torch.arange(4.0))
    buffer = io.BytesIO()
    torch.save(state, buffer)
    assert received.parse_checkpoint(buffer.getvalue(), "x")["step"] == 3


class Payload:
    def __reduce__(self):
        return (print, ("ran",))


def test_a_checkpoint_that_would_run_code_is_not_unpickled(run, capsys):
    torch.save({"x": Payload()}, run / "bad.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        received.load_checkpoint(run / "bad.pt")
    assert "ran" not in capsys.readouterr().out


def test_a_checkpoint_too_deep_is_refused(run):
    torch.save(nested(received.MAX_DEPTH + 1), run / "deep.pt")
    with pytest.raises(ReceivedFileError, match="nested deeper"):
        received.load_checkpoint(run / "deep.pt")
    buffer = io.BytesIO()
    torch.save(nested(received.MAX_DEPTH + 1), buffer)
    with pytest.raises(ReceivedFileError, match="nested deeper"):
        received.parse_checkpoint(buffer.getvalue(), "x")


# ---- images -------------------------------------------------------------------------------


def encoded(format: str, size=(7, 5), **options) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (9, 99, 199)).save(buffer, format=format, **options)
    return buffer.getvalue()


@pytest.mark.parametrize("format", ["PNG", "JPEG", "BMP", "GIF"])
def test_an_images_size_is_read_from_its_header(format):
    assert received.image_size(encoded(format)) == (7, 5)


def test_a_jpegs_size_is_found_past_its_other_segments():
    exif = Image.Exif()
    exif[0x010E] = "a description long enough to make a segment"
    data = encoded("JPEG", (13, 4), exif=exif.tobytes(), progressive=True)
    assert received.image_size(data) == (13, 4)
    padded = data[:2] + b"\xff" + data[2:]  # a fill byte before a marker
    assert received.image_size(padded) == (13, 4)
    assert received._jpeg_size(data[:2] + b"\x00" + data[3:]) is None, "no marker: no size"
    assert received._jpeg_size(data[:10]) is None, "cut short of a frame"


def test_no_header_no_size():
    assert received.image_size(b"not an image at all") is None
    assert received.image_size(b"\x89PNG\r\n\x1a\n" + b"\x00" * 10) is None


def huge_png(width: int, height: int) -> bytes:
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + header + b"\x00" * 4


def test_an_image_over_the_pixel_cap_is_refused_from_its_header():
    side = 2**14  # 2**28 pixels
    with pytest.raises(ReceivedFileError) as refused:
        received.check_pixels(huge_png(side, side), "big.png")
    assert str(refused.value) == (
        f"big.png: an image of {side} x {side} pixels, more than {received.MAX_PIXELS} may be "
        "decoded: refused"
    )
    received.check_pixels(huge_png(2**13, 2**14), "edge.png")  # 2**27 exactly: allowed
    received.check_pixels(b"garbage", "x")


def test_an_image_pil_itself_calls_a_bomb_is_refused_in_one_line():
    data = encoded("BMP")
    data = data[:18] + struct.pack("<ii", 2**16, 2**16) + data[26:]  # a BMP header's size
    with pytest.raises(ReceivedFileError) as refused:
        received.check_pixels(data, "bomb.bmp")
    assert "(more pixels than may be decoded): refused" in str(refused.value)


def test_each_kind_of_special_file_has_its_name():
    import stat

    assert received._file_type(stat.S_IFIFO) == "FIFO"
    assert received._file_type(stat.S_IFCHR) == "character device"
    assert received._file_type(stat.S_IFBLK) == "block device"
    assert received._file_type(stat.S_IFSOCK) == "socket"
    assert received._file_type(stat.S_IFDIR) == "folder"
    assert received._file_type(0) == "special file"


def test_a_refusal_keeps_its_reason_and_names_the_file_printably():
    error = ReceivedFileError("run/\x1b[31mred.json", "why")
    assert error.why == "why" and "\x1b" not in str(error)
    assert json.dumps(str(error))


# ---- each reader keeps the folder the command named ----------------------------------------


@pytest.fixture
def linked_in(run, tmp_path):
    """A folder of the run that is a link to one outside it, holding one file of each kind."""
    outside = tmp_path / "other"
    outside.mkdir()
    (outside / "record.yaml").write_text("a: 1\n")
    (outside / "record.json").write_text('{"a": 1}')
    torch.save({"a": torch.zeros(1)}, outside / "last.pt")
    (run / "linked").symlink_to(outside)
    return run / "linked"


@pytest.mark.parametrize(
    "read",
    [
        lambda folder, run: received.read_bytes(folder / "record.yaml", "record", run),
        lambda folder, run: received.read_text(folder / "record.yaml", root=run),
        lambda folder, run: received.load_yaml(folder / "record.yaml", run),
        lambda folder, run: received.load_json(folder / "record.json", root=run),
        lambda folder, run: received.load_checkpoint(folder / "last.pt", run),
        lambda folder, run: received.load_checkpoint(folder / "last.pt", run, mmap=True),
    ],
    ids=["bytes", "text", "yaml", "json", "checkpoint", "mapped checkpoint"],
)
def test_every_reader_refuses_a_file_reached_out_of_the_folder_named(run, linked_in, read):
    with pytest.raises(ReceivedFileError, match="lies outside"):
        read(linked_in, run)


def test_a_second_name_outside_alone_is_refused(run, tmp_path):
    os.link(run / "summary.json", tmp_path / "outside.json")
    assert "has a hard link outside its folder" in refusal(run / "summary.json", root=run)


def test_a_link_inside_to_a_file_linked_from_outside_is_not_a_name_of_it(run, tmp_path):
    os.link(run / "summary.json", tmp_path / "outside.json")
    (run / "alias.json").symlink_to(run / "summary.json")
    assert "has a hard link outside its folder" in refusal(run / "summary.json", root=run)


def test_a_file_gone_while_the_folder_is_walked_does_not_stop_the_count(run, monkeypatch):
    os.link(run / "summary.json", run / "second")
    monkeypatch.setattr(received.os, "walk", lambda root: [(str(run), [], ["gone", "second"])])
    assert received._links_inside(run, os.stat(run / "summary.json")) == 1


def test_a_socket_names_the_systems_reason_alone(run):
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(run / "socket"))
        assert (
            refusal(run / "socket")
            == f"{run / 'socket'}: cannot be read (No such device or address)"
        )
    finally:
        server.close()


def test_a_checkpoint_that_would_run_code_is_refused_however_it_is_read(run, capsys):
    torch.save({"x": Payload()}, run / "bad.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        received.load_checkpoint(run / "bad.pt", mmap=True)
    with pytest.raises(Exception, match="Weights only load failed"):
        received.parse_checkpoint((run / "bad.pt").read_bytes(), "bad.pt")
    assert "ran" not in capsys.readouterr().out


def test_each_shape_refusal_names_its_source(run):
    torch.save(nested(received.MAX_DEPTH + 1), run / "deep.pt")
    with pytest.raises(ReceivedFileError, match=rf"^{run / 'deep.pt'}: nested deeper"):
        received.load_checkpoint(run / "deep.pt")
    with pytest.raises(ReceivedFileError, match=r"^x\.pt: nested deeper"):
        received.parse_checkpoint((run / "deep.pt").read_bytes(), "x.pt")
    with pytest.raises(ReceivedFileError, match=r"^a\.json: nested deeper"):
        received.parse_json("[" * 70 + "]" * 70, "a.json")


def test_each_level_of_a_mapping_counts_once():
    value: dict = {}
    for _ in range(40):
        value = {"k": value}
    received.check_shape(value, "x")  # 40 levels: within the cap


def test_yaml_damage_without_a_place_or_a_problem_says_what_it_can(monkeypatch):
    import yaml

    def context_only(text, **options):
        raise yaml.MarkedYAMLError(context="while parsing a block", problem=None)

    monkeypatch.setattr(received.yaml, "load", context_only)
    with pytest.raises(ReceivedFileError) as refused:
        received.parse_yaml("a: 1\n", "c.yaml")
    assert str(refused.value) == "c.yaml: not valid YAML (while parsing a block)"

    def bare(text, **options):
        raise yaml.YAMLError("no detail")

    monkeypatch.setattr(received.yaml, "load", bare)
    with pytest.raises(ReceivedFileError) as refused:
        received.parse_yaml("a: 1\n", "c.yaml")
    assert str(refused.value) == "c.yaml: not valid YAML"


def jpeg(*segments: bytes) -> bytes:
    return b"\xff\xd8" + b"".join(segments)


def frame(marker: int, width: int = 7, height: int = 5) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">HBHH", 17, 8, height, width)


def segment(marker: int, length: int = 4) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", length) + b"\x00" * (length - 2)


@pytest.mark.parametrize("marker", [0xC0, 0xC2, 0xCF])
def test_a_jpeg_frame_of_any_kind_gives_the_size(marker):
    assert received.image_size(jpeg(frame(marker))) == (7, 5), "a header ending at the frame"


@pytest.mark.parametrize("marker", [0xC4, 0xC8, 0xCC, 0xD0, 0xE1])
def test_segments_that_are_no_frame_are_skipped(marker):
    assert received.image_size(jpeg(segment(marker, 6), frame(0xC0))) == (7, 5)


def test_a_jpeg_larger_than_a_signed_short_is_measured_whole():
    assert received.image_size(jpeg(frame(0xC0, width=40_000, height=50_000))) == (40_000, 50_000)
    long_segment = segment(0xE1, 0x8000)
    assert received.image_size(jpeg(long_segment, frame(0xC0))) == (7, 5)


def test_a_truncated_jpeg_has_no_size():
    data = jpeg(segment(0xE0, 16), frame(0xC0))
    assert received._jpeg_size(data[:21]) is None


def test_a_png_header_of_exactly_its_size_and_a_width_past_a_signed_int():
    assert received.image_size(huge_png(3, 4)[:24]) == (3, 4)
    with pytest.raises(ReceivedFileError, match="pixels, more than"):
        received.check_pixels(huge_png(2**31, 1), "wide.png")


def test_an_image_pil_itself_calls_a_bomb_names_its_file():
    data = encoded("BMP")
    data = data[:18] + struct.pack("<ii", 2**16, 2**16) + data[26:]
    with pytest.raises(ReceivedFileError, match=r"^bomb\.bmp: "):
        received.check_pixels(data, "bomb.bmp")
