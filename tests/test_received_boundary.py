"""Files from someone else through the one boundary (guards/received.py), tried as the issue's
attacker tried them: special files, links out, shared references, alias and pixel bombs,
planted modules. Each ends in one line within seconds, nothing outside the received folder
changes, and nothing is read through a link out of it.

Each entry point runs in this process under `bounded`, an interval timer: a read that waits
(a FIFO) or never ends (/dev/zero) fails its test instead of hanging the suite."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import signal
import site
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import yaml

from repro.core.guards import received
from repro.core.watch import trackers
from repro.evaluate import main as evaluate_main
from repro.export.command import main as export_main
from repro.resume import command as resume
from repro.verify import command as verify

from conftest import ROOT, tiny, train_in_process

RUN = tiny("trainer.max_steps=2", "model.widths=[8,16]")
LIMIT_S = 20  # far above a refusal (well under a second), far below a hang


@contextlib.contextmanager
def bounded(seconds: float = LIMIT_S) -> Iterator[None]:
    """Fail with TimeoutError if the block runs longer than `seconds` (a blocking open or read
    is interrupted by the signal)."""

    def expire(*_):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` with its bytes' digest (links listed, not followed)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() or not path.is_file():
            found[str(path)] = "link" if path.is_symlink() else "folder"
        else:
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def exit_code(main: Callable[[list[str]], None], *argv: str) -> int:
    with pytest.raises(SystemExit) as done, bounded():
        main(list(argv))
    return done.value.code


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    train_in_process(run_dir, *RUN)
    return run_dir


@pytest.fixture
def place(tmp_path, trained) -> tuple[Path, Path]:
    """A copy of the trained run as received (`tmp/received`) and the rest of the machine
    (`tmp/outside`, holding a copy of the run's checkpoint: a read through a link succeeds)."""
    folder, outside = tmp_path / "received", tmp_path / "outside"
    shutil.copytree(trained, folder)
    outside.mkdir()
    shutil.copy(trained / "checkpoints" / "last.pt", outside / "secret.pt")
    (outside / "notes.txt").write_text("the user's own file\n")
    return folder, outside


# --- the payloads: each turns the received folder's files into what the issue found ---


def _checkpoints(folder: Path) -> list[Path]:
    return [folder / "checkpoints" / name for name in ("best.pt", "last.pt")]


def fifo_checkpoints(folder: Path, outside: Path) -> None:
    for path in _checkpoints(folder):
        path.unlink(missing_ok=True)
        os.mkfifo(path)


def device_links(folder: Path, outside: Path) -> None:
    for path in _checkpoints(folder):
        path.unlink(missing_ok=True)
        path.symlink_to("/dev/zero")


def hard_links_out(folder: Path, outside: Path) -> None:
    for path in _checkpoints(folder):
        path.unlink(missing_ok=True)
        os.link(outside / "secret.pt", path)


def symlinked_folder_out(folder: Path, outside: Path) -> None:
    shutil.copytree(folder / "checkpoints", outside / "checkpoints")
    shutil.rmtree(folder / "checkpoints")
    (folder / "checkpoints").symlink_to(outside / "checkpoints")


def shared_references(folder: Path, outside: Path) -> None:
    """4 references to 4 references, 40 deep: 2 KB on disk, 4**40 values to a walk."""
    nested: list = []
    for _ in range(40):
        nested = [nested] * 4
    for path in _checkpoints(folder):
        state = torch.load(path, weights_only=True)
        state["extra"] = {"bomb": nested}
        torch.save(state, path)


CHECKPOINT_PAYLOADS = {
    "fifo": (fifo_checkpoints, "a FIFO, not a regular file"),
    "device link": (device_links, "a symbolic link"),
    "hard link out": (hard_links_out, "hard link outside its folder"),
    "folder link out": (symlinked_folder_out, "lies outside"),
    "shared references": (shared_references, "shared references counted"),
}


@pytest.mark.parametrize("tool", ["evaluate", "export"])
@pytest.mark.parametrize("payload", sorted(CHECKPOINT_PAYLOADS))
def test_a_received_checkpoint_is_refused_in_one_line_within_seconds(place, payload, tool, capsys):
    folder, outside = place
    make, said = CHECKPOINT_PAYLOADS[payload]
    make(folder, outside)
    before = snapshot(outside)
    started = time.perf_counter()
    if tool == "evaluate":
        code = exit_code(evaluate_main, f"ckpt={folder}")
    else:
        code = exit_code(export_main, f"ckpt={folder}", "format=torchscript", f"out={folder}/m.pt")
    line = one_line(capsys)
    assert code != 0 and said in line, line
    assert time.perf_counter() - started < 10
    assert snapshot(outside) == before


def fifo_summary(folder: Path) -> None:
    (folder / "summary.json").unlink()
    os.mkfifo(folder / "summary.json")


def random_summary(folder: Path) -> None:
    (folder / "summary.json").unlink()
    (folder / "summary.json").symlink_to("/dev/urandom")


def deep_summary(folder: Path) -> None:
    (folder / "summary.json").write_text("[" * 100_000 + "]" * 100_000)


def alias_bomb_config(folder: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 12):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    (folder / "resolved_config.yaml").write_text("\n".join(lines) + "\n")


def deep_config(folder: Path) -> None:
    (folder / "resolved_config.yaml").write_text("a: " + "[" * 50_000 + "]" * 50_000 + "\n")


RECORD_PAYLOADS = {
    "fifo summary": (fifo_summary, "a FIFO"),
    "summary linked to /dev/urandom": (random_summary, "a symbolic link"),
    "summary nested 100,000 deep": (deep_summary, "nested too deep"),
    "alias bomb": (alias_bomb_config, "an alias counted as the node it repeats"),
    "config nested 50,000 deep": (deep_config, "nested deeper than"),
}


@pytest.mark.parametrize("payload", sorted(RECORD_PAYLOADS))
def test_verify_refuses_a_received_record_in_one_line_within_seconds(place, payload, capsys):
    folder, outside = place
    make, said = RECORD_PAYLOADS[payload]
    make(folder)
    before = snapshot(outside)
    assert exit_code(verify.main, str(folder)) != 0
    assert said in one_line(capsys)
    assert snapshot(outside) == before


@pytest.mark.parametrize(
    ("payload", "said"),
    [("fifo summary", "a FIFO"), ("summary linked to /dev/urandom", "is a link to /dev/urandom")],
)
def test_resume_refuses_a_special_summary_in_one_line(place, payload, said, capsys):
    folder, _ = place
    record = {"mode": "RUN", "job": {"num": 0}, "overrides": {"hydra": [], "task": []}}
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": record}))
    RECORD_PAYLOADS[payload][0](folder)
    assert exit_code(resume.main, str(folder)) != 0
    assert said in one_line(capsys)


def test_a_char_device_record_is_refused_not_read(tmp_path):
    with bounded(), pytest.raises(received.ReceivedFileError, match="character device"):
        received.read_bytes("/dev/zero", "table", root="/dev")


def test_a_file_larger_than_its_kind_allows_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setitem(received.SIZE_LIMITS, "record", 1000)
    (tmp_path / "big.json").write_text("[" + "1," * 1000 + "1]")
    with pytest.raises(received.ReceivedFileError, match=r"more than a record file may hold"):
        received.load_json(tmp_path / "big.json")


def test_hard_links_among_a_runs_own_checkpoints_are_read(trained):
    last = trained / "checkpoints" / "last.pt"
    steps = sorted((trained / "checkpoints").glob("step-*.pt"))
    assert steps and last.stat().st_nlink == 2  # last.pt names the newest step file
    assert received.load_checkpoint(last)["format"] == "repro-checkpoint"


# --- pixels: the header is measured before any pixel is decoded ---


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header asks for width x height RGB pixels, with one tiny compressed row."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\0" * (1 + 3 * min(width, 1000)))
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize("suffix", [".png", ".bmp"])
def test_an_image_asking_for_billions_of_pixels_is_refused_before_decoding(tmp_path, suffix):
    from PIL import Image

    from repro.core.data.sources import decode_file
    from repro.core.errors import DataError

    path = tmp_path / f"bomb{suffix}"
    if suffix == ".png":
        path.write_bytes(png_header_only(70_000, 70_000))  # 4.9 G pixels, 14.7 GB as RGB
    else:
        Image.new("RGB", (16, 16)).save(path)
        data = bytearray(path.read_bytes())
        data[18:26] = struct.pack("<ii", 70_000, 70_000)  # BITMAPINFOHEADER's width, height
        path.write_bytes(bytes(data))
    with bounded(), pytest.raises(DataError, match=r"4900000000 pixels.*refused|70000 x 70000"):
        decode_file(path)


def test_a_small_image_decodes_as_before(tmp_path):
    from PIL import Image

    from repro.core.data.sources import decode_file

    Image.new("RGB", (7, 5), (10, 20, 30)).save(tmp_path / "small.png")
    pixels = decode_file(tmp_path / "small.png")
    assert pixels.shape == (3, 5, 7) and pixels[:, 0, 0].tolist() == [10, 20, 30]


# --- a sweep record is data: never resolved, never rewritten through a link ---


def test_a_resolver_in_multirun_yaml_stays_text(tmp_path, monkeypatch):
    outside = tmp_path / "outside"
    monkeypatch.setenv("REPRO_SECRET", "from-the-environment")
    task = [f"+note=${{record_subdir:{outside}}}", "+env=${oc.env:REPRO_SECRET}", "seed=1,2"]
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    record = {"hydra": {"overrides": {"task": task}}}
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(record))
    assert trackers._recorded_task(sweep / "multirun.yaml", sweep) == task
    assert not outside.exists()


def test_resume_refuses_a_sweep_whose_record_hydra_would_rewrite_through_a_hard_link(
    tmp_path, capsys
):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    original = tmp_path / "my_own_sweep_record.yaml"
    original.write_text("hydra: {mode: MULTIRUN}\n")
    os.link(original, sweep / "multirun.yaml")
    assert exit_code(resume.main, str(sweep)) != 0
    assert "multirun.yaml has another hard link" in one_line(capsys)
    assert original.read_text() == "hydra: {mode: MULTIRUN}\n"


# --- tools never import from the working directory ---


@pytest.mark.parametrize("start", [["-m", "repro.evaluate"], ["-X", "dev", "-m", "repro.evaluate"]])
def test_a_repro_package_planted_in_the_working_directory_is_never_imported(tmp_path, start):
    planted = tmp_path / "received" / "repro"
    planted.mkdir(parents=True)
    marker = tmp_path / "imported"
    (planted / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (planted.parent / "torch.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (planted.parent / "runpy.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    done = subprocess.run(
        [sys.executable, *start, "ckpt=."],
        cwd=planted.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert not marker.exists(), "a module planted in the working directory was imported"
    assert done.returncode == 2 and done.stderr.strip().startswith("error: "), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_other_commands_keep_their_working_directory_on_the_path(tmp_path):
    (tmp_path / "helper_module.py").write_text("VALUE = 7\n")
    done = subprocess.run(
        [sys.executable, "-c", "import helper_module; print(helper_module.VALUE)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "7", done.stderr


def test_the_interpreter_start_hook_ships_with_the_engine():
    hook = ROOT / "src" / "repro_safe_path.pth"
    # The working directory is marked as a place no import looks in; no second interpreter.
    assert "sys.path_importer_cache[os.getcwd()] = None" in hook.read_text()
    assert "execv" not in hook.read_text()
    installed = [Path(folder) / hook.name for folder in site.getsitepackages()]
    assert [path.read_text() for path in installed if path.exists()] == [hook.read_text()]
    assert (
        '"src/repro_safe_path.pth" = "repro_safe_path.pth"' in (ROOT / "pyproject.toml").read_text()
    )


def test_shape_caps_count_a_shared_value_at_each_use():
    shared = list(range(1000))
    received.check_shape([shared] * 1000, "fine")  # a million values: a checkpoint's worth
    with pytest.raises(received.ReceivedFileError, match="shared references counted"):
        received.check_shape([[shared] * 1000] * 10, "too many")
    buffer = io.BytesIO()
    torch.save({"deep": [[[[[]]]]]}, buffer)
    assert received.parse_checkpoint(buffer.getvalue(), "small") == {"deep": [[[[[]]]]]}


# --- a checkpoint of the wrong layout: one line, whatever its digest says ---


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda s: s.update(model=[1, 2]), "model is not a mapping of names to tensors"),
        (lambda s: s.update(model={k: "x" for k in s["model"]}), "model is not a mapping"),
        (lambda s: s.update(position="x"), "position is not a mapping with an integer step"),
        (lambda s: s["position"].update(step="2"), "position is not a mapping"),
        (lambda s: s.update(classes=5), "classes is not a list of names"),
        (lambda s: s.update(normalisation=[0.5]), "normalisation is not a mapping"),
        (lambda s: s.update(root_seed="0"), "root_seed is not an integer"),
        (lambda s: s.update(model={k: torch.zeros(1) for k in s["model"]}), "do not fit the model"),
    ],
)
def test_a_checkpoint_of_the_wrong_layout_is_one_line(trained, tmp_path, edit, said, capsys):
    from repro.core.runs import checkpoint

    state = checkpoint.load(trained / "checkpoints" / "last.pt")
    edit(state)
    checkpoint.atomic_save(state, tmp_path / "crafted.pt")  # with a digest that matches
    assert exit_code(evaluate_main, f"ckpt={tmp_path / 'crafted.pt'}") == 2
    assert said in one_line(capsys)


# --- what we write into a folder from someone else: never through a link ---


@pytest.mark.parametrize("planted", ["symlink", "hard link", "fifo"])
def test_a_file_written_in_place_is_never_written_through_a_planted_link(tmp_path, planted):
    from repro.core.files import open_in_place

    outside = tmp_path / "outside.txt"
    outside.write_text("the user's own file\n")
    path = tmp_path / "metrics.csv"
    if planted == "symlink":
        path.symlink_to(outside)
    elif planted == "hard link":
        os.link(outside, path)
    else:
        os.mkfifo(path)
    for mode in ("a", "wb"):
        with bounded(), pytest.raises(OSError) as refused:
            open_in_place(path, mode)
        assert not isinstance(refused.value, TimeoutError)  # refused at once, not waited on
    assert outside.read_text() == "the user's own file\n"
    fresh = tmp_path / "fresh.csv"
    with open_in_place(fresh, "a", newline="") as handle:
        handle.write("step,loss\n")
    with open_in_place(fresh, "wb") as handle:
        handle.write(b"new\n")
    assert fresh.read_bytes() == b"new\n"
