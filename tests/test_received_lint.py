"""No product code reads a file any other way than through the boundary (guards/received.py):
every call that opens a path for reading or parses a file (`open`, `Path.open`, `read_text`,
`read_bytes`, `torch.load`, `yaml.load`, `json.load`, `OmegaConf.load`, `pickle.load`,
`np.load`, `tarfile.open`, `Image.open`, `os.open` without O_CREAT) is listed here, and each
one outside the boundary must be named below with why what it reads is no one else's."""

from __future__ import annotations

import ast

from conftest import ROOT

SOURCES = ROOT / "src" / "repro"
BOUNDARY = "core/guards/received.py"

# module -> how many reads it makes outside the boundary, and why each reads only what this
# checkout or this machine made (never a received folder, checkpoint, dataset or shard). The
# count is exact: a read added to one of these modules must be argued for here too.
OWN_FILES = {
    "core/runtime/environment.py": (2, "this machine's /proc/cpuinfo and this checkout's uv.lock"),
    "core/runs/run_lock.py": (1, "this machine's /proc/self/mountinfo"),
    "core/runs/trust.py": (2, "the trusted YAML of this checkout's conf/ (git ls-files)"),
    "manual/command.py": (2, "the docs installed with the engine"),
    "verify/upgrade.py": (2, "the user's own project's pyproject.toml, read and rewritten"),
    "verify/explain.py": (2, "the user's own project's pyproject.toml and README"),
    "verify/imports.py": (2, "the engine's own api source, the user's own project's src/*.py"),
    "extras/testkit/project.py": (1, "the user's own project's conf/experiment/*.yaml"),
    "extras/testkit/runs.py": (2, "the kit's own scratch runs, made by this test session"),
    "extras/testkit/checks.py": (1, "the kit's own scratch runs, made by this test session"),
}

READERS = {"read_text", "read_bytes"}
QUALIFIED = {
    ("torch", "load"),
    ("yaml", "load"),
    ("yaml", "safe_load"),
    ("yaml", "full_load"),
    ("json", "load"),
    ("OmegaConf", "load"),
    ("pickle", "load"),
    ("np", "load"),
    ("numpy", "load"),
    ("Image", "open"),
}


def _mode(call: ast.Call, position: int) -> str | None:
    """The literal mode argument of an open-like call, if given."""
    found = call.args[position] if len(call.args) > position else None
    for keyword in call.keywords:
        if keyword.arg == "mode":
            found = keyword.value
    return found.value if isinstance(found, ast.Constant) and isinstance(found.value, str) else None


def _writes(mode: str | None) -> bool:
    return mode is not None and any(flag in mode for flag in "wax")


def _in_memory(call: ast.Call) -> bool:
    """A parse of bytes already read (through the boundary): `Image.open(io.BytesIO(data))`,
    `tarfile.open(fileobj=handle)`."""
    first = call.args[0] if call.args else None
    wrapped = isinstance(first, ast.Call) and ast.unparse(first.func) in ("io.BytesIO", "BytesIO")
    return wrapped or any(keyword.arg == "fileobj" for keyword in call.keywords)


def reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each call in `tree` that reads a file outside the boundary's way."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        if isinstance(function, ast.Name) and function.id == "open":
            if not _writes(_mode(node, 1)):
                found.append((node.lineno, "open()"))
        elif isinstance(function, ast.Attribute):
            owner = function.value.id if isinstance(function.value, ast.Name) else None
            name = function.attr
            if owner == "received":  # the boundary's own functions
                continue
            if name in READERS:
                found.append((node.lineno, f".{name}()"))
            elif (owner, name) in QUALIFIED and not _in_memory(node):
                found.append((node.lineno, f"{owner}.{name}()"))
            elif owner == "tarfile" and name == "open" and not _in_memory(node):
                if not _writes(_mode(node, 1)):
                    found.append((node.lineno, "tarfile.open()"))
            elif owner == "os" and name == "open":
                flags = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
                # Reading is O_RDONLY (a folder's descriptor, to fsync it, reads no file).
                if not flags or ("O_RDONLY" in flags and "O_DIRECTORY" not in flags):
                    found.append((node.lineno, "os.open()"))
            elif (
                name == "open"
                and owner not in ("os", "tarfile", "Image")
                and not _writes(_mode(node, 0))
            ):
                found.append((node.lineno, ".open()"))
    return found


def test_product_code_reads_files_only_through_the_boundary():
    outside = []
    for path in sorted(SOURCES.rglob("*.py")):
        module = path.relative_to(SOURCES).as_posix()
        found = reads(ast.parse(path.read_text(), str(path)))
        if module == BOUNDARY or len(found) == OWN_FILES.get(module, (0, ""))[0]:
            continue
        for line, what in found:
            outside.append(f"src/repro/{module}:{line}: {what}")
    assert outside == [], (
        "these read files outside guards/received.py; read through it (or, for a file only "
        "this checkout or machine makes, count the read in OWN_FILES and say why):\n"
        + "\n".join(outside)
    )


def test_the_lint_sees_each_way_of_reading():
    code = "\n".join(
        [
            "open(p)",
            "open(p, 'rb')",
            "p.open()",
            "p.open('rb')",
            "p.read_text()",
            "p.read_bytes()",
            "torch.load(p)",
            "yaml.safe_load(f)",
            "json.load(f)",
            "OmegaConf.load(p)",
            "pickle.load(f)",
            "np.load(p)",
            "Image.open(p)",
            "tarfile.open(p)",
            "os.open(p, os.O_RDONLY)",
            "tarfile.open(p, 'r:')",
        ]
    )
    assert [line for line, _ in reads(ast.parse(code))] == list(range(1, 17))
    writes = "open(p, 'w')\np.open('ab')\ntarfile.open(p, 'w')\nos.open(p, os.O_RDWR | os.O_CREAT)"
    writes += "\nos.open(d, os.O_RDONLY | os.O_DIRECTORY)\nreceived.read_text(p)"
    writes += "\nos.open(p, flags, 0o644)"
    writes += "\nImage.open(io.BytesIO(data))\ntarfile.open(fileobj=handle, mode='r:')"
    assert reads(ast.parse(writes)) == []
