"""Shards from someone else, fuzzed: the entry points built since the first fuzzer (packing,
verifying a local shard set, verifying one on S3 through the cache, training on shards) run on
a shard set, a source folder and a cache holding special files, links out, damaged manifests
and odd tar members, placed at random. Whatever a case draws, every command answers within
its time, a refusal is one line on stderr and never a traceback, nothing outside the case's
folder changes, and no byte of a file outside the source reaches a shard.

Each case is drawn from `random.Random(seed)`; its id (`0007-shard`) names the seed and the
kind of its first payload. `test_shards_fuzz_fast` (4 cases, one of each kind) runs in `make test`,
`test_shards_fuzz_many` (60) in `make test-all`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import stat
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from repro.shards.pack import pack
from test_shards import s3_server  # noqa: F401  (moto's S3 server: a fixture this module uses)

from conftest import make_image_tree

SHARD_BYTES = 8000
SECRET = b"-----BEGIN OPENSSH PRIVATE KEY----- the user's own key"
TIMEOUT_S = 120  # a command that waits on a FIFO or reads /dev/zero fails its case here
FAST_CASES, MANY_CASES = 4, 60  # fast: one case of each kind
# What moto's server accepts.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class Case:
    seed: int
    root: Path
    rng: random.Random
    payloads: list[str] = field(default_factory=list)
    entries: set[str] = field(default_factory=set)

    @property
    def shards(self) -> Path:
        return self.root / "shards"

    @property
    def source(self) -> Path:
        return self.root / "images"

    @property
    def outside(self) -> Path:
        return self.root / "outside"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    def note(self, said: str, *entries: str) -> None:
        self.payloads.append(said)
        self.entries.update(entries)


def special(case: Case, path: Path, how: str) -> str:
    """Make `path` a FIFO, a link to a device, a link out, or a hard link to a file outside
    (a copy of what it was, so a read through it would succeed)."""
    copy = case.outside / f"copy-{len(case.payloads)}-{path.name}"
    if path.is_file() and not path.is_symlink():
        shutil.copy2(path, copy)
    else:
        copy.write_bytes(SECRET)
    path.unlink(missing_ok=True)
    if how == "fifo":
        os.mkfifo(path)
    elif how in ("/dev/zero", "/dev/urandom"):
        path.symlink_to(how)
    elif how == "symlink out":
        path.symlink_to(copy)
    else:
        os.link(copy, path)
    return f"{path.relative_to(case.root)} made a {how}"


HOWS = ("fifo", "/dev/zero", "/dev/urandom", "symlink out", "hard link out")


def _manifest(case: Case) -> dict:
    return json.loads((case.shards / "manifest.json").read_text())


def _shard_names(case: Case) -> list[str]:
    return sorted(p.name for p in case.shards.glob("*.tar"))


def manifest_payload(case: Case) -> None:
    """The manifest made a special file, nested past the cap, or of the wrong types."""
    rng, path = case.rng, case.shards / "manifest.json"
    choice = rng.choice(["special", "deep", "types", "names", "not json"])
    if choice == "special":
        said = special(case, path, rng.choice(HOWS))
    elif choice == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
        said = "manifest nested 100,000 deep"
    elif choice == "not json":
        path.write_bytes(b"\xff\xfe{not json")
        said = "manifest not JSON, not UTF-8"
    else:
        manifest = _manifest(case)
        entry = rng.choice(manifest["splits"]["train"])
        key, value = rng.choice(
            [("size", "x"), ("size", -5), ("sha256", 7), ("index", "x"), ("index", [[-1, 9]])]
            if choice == "types"
            else [("name", "../outside/x.tar"), ("name", "/etc/passwd"), ("name", ".")]
        )
        entry[key] = value
        path.write_text(json.dumps(manifest))
        said = f"manifest entry {key}={value!r}"
    case.note(said, "verify", "train")


def shard_payload(case: Case) -> None:
    """A shard made a special file, cut short, or rewritten with an odd tar member (its
    manifest entry brought in line, as a maker of a crafted set would)."""
    rng = case.rng
    name = rng.choice(_shard_names(case))
    path = case.shards / name
    choice = rng.choice(["special", "special", "truncated", "member"])
    if choice == "special":
        said = special(case, path, rng.choice(HOWS))
    elif choice == "truncated":
        path.write_bytes(path.read_bytes()[: rng.randint(0, 600)])
        said = f"{name} cut short"
    else:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            member = tarfile.TarInfo(rng.choice(["../../outside/x.png", "/etc/x.png", "a.png"]))
            kind = rng.choice(["symlink", "hardlink", "device", "file"])
            member.type = {
                "symlink": tarfile.SYMTYPE,
                "hardlink": tarfile.LNKTYPE,
                "device": tarfile.CHRTYPE,
                "file": tarfile.REGTYPE,
            }[kind]
            member.linkname = "/etc/passwd" if kind in ("symlink", "hardlink") else ""
            tar.addfile(member, io.BytesIO(b"") if kind == "file" else None)
        path.write_bytes(buffer.getvalue())
        manifest = _manifest(case)
        for entry in manifest["splits"]["train"] + manifest["splits"].get("val", []):
            if entry["name"] == name:
                entry["size"] = len(buffer.getvalue())
                entry["sha256"] = hashlib.sha256(buffer.getvalue()).hexdigest()
        (case.shards / "manifest.json").write_text(json.dumps(manifest))
        said = f"{name} rewritten with a {kind} member {member.name!r}"
    case.note(said, "verify", "train")


def source_payload(case: Case) -> None:
    """The folder `pack` reads: an image made a link out (to a key), a FIFO, a device link;
    a class folder linked out; an image whose header asks for billions of pixels."""
    rng = case.rng
    images = sorted(p for p in case.source.rglob("*") if p.is_file())
    image = rng.choice(images)
    choice = rng.choice(["special", "special", "folder out", "pixels"])
    if choice == "special":
        said = special(case, image, rng.choice(HOWS))
    elif choice == "folder out":
        folder = image.parent
        shutil.copytree(folder, case.outside / f"class-{folder.name}")
        (case.outside / f"class-{folder.name}" / "key.png").write_bytes(SECRET)
        shutil.rmtree(folder)
        folder.symlink_to(case.outside / f"class-{folder.name}")
        said = f"{folder.relative_to(case.root)} linked out"
    else:
        from test_received_boundary import png_header_only

        image.with_suffix(".png").write_bytes(png_header_only(70_000, 70_000))
        image.unlink() if image.suffix != ".png" else None
        said = f"{image.relative_to(case.root)}: a PNG of 70000 x 70000 pixels"
    case.note(said, "pack")


def cache_payload(case: Case) -> None:
    """The S3 cache folder, as if shipped beside a run: a planted lock that links to a file of
    the user's, a cached shard that is a link out or a FIFO."""
    rng = case.rng
    case.cache.mkdir(exist_ok=True)
    name = rng.choice(_shard_names(case))
    choice = rng.choice(["lock", "cached link", "cached fifo"])
    if choice == "lock":
        (case.cache / f".{name}.lock").symlink_to(case.outside / "notes.txt")
        said = f"cache/.{name}.lock linked to outside/notes.txt"
    elif choice == "cached link":
        shutil.copy2(case.shards / name, case.outside / f"cached-{name}")
        (case.cache / name).symlink_to(case.outside / f"cached-{name}")
        said = f"cache/{name} linked out"
    else:
        os.mkfifo(case.cache / name)
        said = f"cache/{name} a FIFO"
    case.note(said, "s3verify")


KINDS: dict[str, Callable[[Case], None]] = {
    "manifest": manifest_payload,
    "shard": shard_payload,
    "source": source_payload,
    "cache": cache_payload,
}


def kind_of(seed: int) -> str:
    return list(KINDS)[seed % len(KINDS)]


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every entry under `folder`, links not followed: bytes and times of files."""
    found = {}
    for path in sorted(folder.rglob("*")):
        info = path.lstat()
        if stat.S_ISREG(info.st_mode):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            found[str(path)] = (digest, info.st_mtime_ns)
        else:
            found[str(path)] = (stat.S_IFMT(info.st_mode),)
    return found


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shards-fuzz")
    make_image_tree(root / "images")
    pack(root / "images", root / "shards", SHARD_BYTES)
    return root


@pytest.fixture(scope="module")
def bucket(base, request) -> tuple[str, str] | None:
    """The base shard set on a local S3 server (moto), if moto is installed."""
    from test_shards import _upload

    try:
        endpoint = request.getfixturevalue("s3_server")
    except pytest.skip.Exception:  # no moto here: the cache's cases run the rest
        return None
    with pytest.MonkeyPatch.context() as patch:
        for key, value in CREDENTIALS.items():
            patch.setenv(key, value)
        return endpoint, _upload(endpoint, base / "shards", "fuzz")


def make_case(seed: int, base: Path, folder: Path) -> Case:
    case = Case(seed, folder, random.Random(seed))
    shutil.copytree(base / "shards", case.shards)
    shutil.copytree(base / "images", case.source)
    case.outside.mkdir()
    (case.outside / "notes.txt").write_text("the user's own notes\n")
    (case.outside / "id_ed25519").write_bytes(SECRET)
    kinds = [kind_of(seed), *case.rng.choices(list(KINDS), k=case.rng.choice([0, 0, 1]))]
    for kind in kinds:
        try:
            KINDS[kind](case)
        except (OSError, ValueError, IndexError, KeyError) as error:  # an earlier one removed it
            case.payloads.append(f"{kind}: not applied ({type(error).__name__})")
    return case


def command(case: Case, entry: str, bucket: tuple[str, str] | None) -> list[str] | None:
    work = case.root / "work"
    if entry == "verify":
        return ["-m", "repro.shards", "verify", str(case.shards)]
    if entry == "pack":
        return [
            "-m",
            "repro.shards",
            "pack",
            str(case.source),
            str(work / "packed"),
            "--shard-size",
            str(SHARD_BYTES),
        ]
    if entry == "s3verify" and bucket is not None:
        endpoint, url = bucket
        return [
            "-m",
            "repro.shards",
            "verify",
            url,
            "--endpoint-url",
            endpoint,
            "--cache-dir",
            str(case.cache),
        ]
    if entry == "train":
        from conftest import IMAGEFOLDER

        overrides = [o.replace("data=imagefolder", "data=shards") for o in IMAGEFOLDER]
        return [
            "-m",
            "repro.train",
            *overrides,
            f"data.root={case.shards}",
            "trainer.max_steps=2",
            f"hydra.run.dir={work / 'run'}",
        ]
    return None


def judge(case: Case, entry: str, done: subprocess.CompletedProcess | str) -> list[str]:
    if isinstance(done, str):
        return [done]
    wrong = []
    if "Traceback" in done.stdout + done.stderr:
        wrong.append("a traceback")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    if done.returncode != 0 and (len(lines) != 1 or not lines[0].startswith("error: ")):
        wrong.append(f"exit {done.returncode} with {len(lines)} lines on stderr, not one error")
    packed = case.root / "work" / "packed"
    if entry == "pack" and packed.exists():
        if any(SECRET in p.read_bytes() for p in packed.rglob("*") if p.is_file()):
            wrong.append("a file from outside the source went into a shard")
        if done.returncode == 0 and any(
            "linked out" in p or "a symlink" in p or "hard link" in p for p in case.payloads
        ):
            wrong.append("packed a source holding a link out without a word")
    return wrong


def fuzz(seed: int, base: Path, bucket, tmp_path: Path, many: bool) -> None:
    case = make_case(seed, base, tmp_path / "case")
    (case.root / "work").mkdir()
    before = snapshot(case.outside)
    entries = sorted(case.entries - (set() if many else {"train"}))
    found = []
    env = {**os.environ, **CREDENTIALS}
    for entry in entries:
        argv = command(case, entry, bucket)
        if argv is None:
            continue
        try:
            done: subprocess.CompletedProcess | str = subprocess.run(
                [sys.executable, *argv],
                cwd=case.root / "work",
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            done = f"no answer within {TIMEOUT_S} s"
        wrong = judge(case, entry, done)
        after = snapshot(case.outside)
        if after != before:
            wrong.append("outside/ changed")
            before = after
        if wrong:
            said = done if isinstance(done, str) else done.stderr.strip()[-1500:]
            found.append(f"  {entry}: {'; '.join(wrong)}\n    {said}")
    if found:
        payloads = "\n".join(f"  - {p}" for p in case.payloads)
        pytest.fail(f"case {seed:04d}-{kind_of(seed)}:\n{payloads}\n" + "\n".join(found), False)


@pytest.mark.parametrize(
    "seed", [pytest.param(s, id=f"{s:04d}-{kind_of(s)}") for s in range(FAST_CASES)]
)
def test_shards_fuzz_fast(seed, base, bucket, tmp_path):
    fuzz(seed, base, bucket, tmp_path, many=False)


@pytest.mark.slow
@pytest.mark.parametrize(
    "seed", [pytest.param(s, id=f"{s:04d}-{kind_of(s)}") for s in range(1000, 1000 + MANY_CASES)]
)
def test_shards_fuzz_many(seed, base, bucket, tmp_path):
    fuzz(seed, base, bucket, tmp_path, many=True)
