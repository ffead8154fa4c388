"""Start a new experiment from this template: `python scripts/new_project.py NAME [--dest DIR]
[--own-engine [--minimal]]`.

By default the project holds only its own code and depends on the engine (docs/engine.md): the
files of scripts/skeleton/ renamed to NAME (a README, conf/ composing the engine's config
groups through Hydra's search path, one small example of each seam in src/NAME/, tests,
Makefile, CI), a wheel of this checkout's engine in engine/, and a uv.lock pinning it by hash,
so that `make setup` needs nothing but PyPI. Needs uv (as `make setup` does).

With `--own-engine` it copies the template's files (what git tracks, plus new files it does
not ignore) into DIR (default: ../NAME next to the template), renames the package `repro` to
NAME in paths, code, configs, tests and docs and records where it came from in TEMPLATE.md.
It leaves behind run outputs, caches, virtual environments and git-ignored local files. With
`--minimal` (implies `--own-engine`), the fast-CIFAR recipes and the benchmarks stay behind too
(`LEFT_OUT_BY_MINIMAL`), with their configs, tests and scripts: the core alone. Either way it
makes one initial commit in a fresh git repository. Standard library only, so any Python
3.10+ can run it.
"""

from __future__ import annotations

import argparse
import importlib.util
import keyword
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

OLD = "repro"  # the template's package name; in a generated project, that project's name
ROOT = Path(__file__).resolve().parents[1]
# Names that would hide a module the project imports, or one of its own top-level folders.
SHADOWED = {
    "torch", "torchvision", "hydra", "omegaconf", "numpy", "PIL", "pillow", "rich",
    "matplotlib", "tensorboard", "yaml", "pytest", "ruff", "uv", "pip", "setuptools",
    "hatchling", "joblib", "submitit", "optuna", "timm", "torchmetrics", "onnx", "onnxruntime",
    "onnxscript", "safetensors", "test", "tests", "src", "conf", "scripts",
    "docs", "outputs", "data", "benchmarks",
}  # fmt: skip
SKELETON = ROOT / "scripts" / "skeleton"  # a project's own files; its package is `skeleton`
SKELETON_WORD = re.compile(r"\bskeleton\b")
SKIP_PARTS = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".whl"}
WORD = re.compile(rf"\b{OLD}\b", re.IGNORECASE)  # not "reproducible": \b needs a word end
# What `--minimal` leaves out: paths, or folders and name prefixes ending in "/" or "_". The
# core imports none of it (tests/test_layout.py), and no other test needs it.
CONF = f"src/{OLD}/conf"  # the config groups ship in the package; the top-level conf/ links here
LEFT_OUT_BY_MINIMAL = (
    f"src/{OLD}/extras/recipes/", "benchmarks/", f"{CONF}/suite/", f"{CONF}/bench.yaml",
    f"{CONF}/model/whitened_cnn.yaml", f"{CONF}/model/resnet9.yaml",
    f"{CONF}/experiment/cifar10_airbench.yaml", f"{CONF}/experiment/cifar10_speedrun.yaml",
    f"{CONF}/components/lookahead.yaml",
    "tests/test_recipe_", "tests/test_bench.py", "scripts/gpu_figures.sh",
    "scripts/device_batch_cost.py", "docs/benchmarks.md",
)  # fmt: skip
ENV_PREFIX = re.compile(rf"\b{OLD.upper()}_")  # environment variables such as REPRO_DATA


class RefusedError(Exception):
    """A bad name or destination: reported in one line, exit status 2."""


def check_name(name: str) -> None:
    """Refuse names that cannot be, or should not be, a top-level Python package."""
    if not (name.isidentifier() and name.isascii()):
        raise RefusedError(f"{name!r} is not a Python identifier (use letters, digits and _)")
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        raise RefusedError(f"{name!r} is a Python keyword")
    if name in SHADOWED or name in sys.stdlib_module_names or name.lower() in SHADOWED:
        raise RefusedError(f"{name!r} would shadow the module or folder of that name; pick another")


def check_dest(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise RefusedError(f"{dest} already exists and is not an empty folder")
    if dest.resolve().is_relative_to(ROOT.resolve()):
        raise RefusedError(f"{dest} is inside the template; choose a folder outside {ROOT}")


def git(*args: str, cwd: Path) -> str:
    """Run git and return its stdout; raise CalledProcessError on failure."""
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout


def is_kept(rel: str) -> bool:
    """False for caches, environments, run outputs and local files, whatever git says."""
    parts = rel.split("/")
    if SKIP_PARTS & set(parts) or any(part.endswith(".egg-info") for part in parts):
        return False
    if rel.endswith(".pyc") or rel == "TEMPLATE.md":  # TEMPLATE.md is written anew
        return False
    if parts[0] == "outputs":
        return rel == "outputs/.gitkeep"
    if rel.startswith(f"{CONF}/local/"):
        return rel == f"{CONF}/local/.gitkeep"
    return parts[0] != "data"


def template_files() -> list[str]:
    """Tracked and not-ignored untracked files, relative to ROOT; a filtered walk without git."""
    try:
        listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT)
        # A link (conf/ -> src/repro/conf) is kept as a link: is_file() would follow it.
        files = [f for f in listed.split("\0") if f and _is_file_or_link(ROOT / f)]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout
        files = []
        for folder, subfolders, names in os.walk(ROOT):
            subfolders[:] = [d for d in subfolders if d not in SKIP_PARTS]  # never enter .venv
            links = [d for d in subfolders if (Path(folder) / d).is_symlink()]  # walk skips them
            files += [(Path(folder) / n).relative_to(ROOT).as_posix() for n in names + links]
    return sorted(f for f in set(files) if is_kept(f))


def _is_file_or_link(path: Path) -> bool:
    return path.is_symlink() or path.is_file()


def is_recipe_or_benchmark(rel: str) -> bool:
    return any(
        rel.startswith(left) if left.endswith(("/", "_")) else rel == left
        for left in LEFT_OUT_BY_MINIMAL
    )


def without_benchmarks(makefile: str) -> str:
    """The Makefile less its `bench` target and the benchmarks folder in the lint commands."""
    kept = []
    for block in makefile.split("\n\n"):
        if block.startswith("bench:"):
            continue
        lines = [line for line in block.split("\n") if not line.startswith('\t@echo "make bench')]
        kept.append("\n".join(lines).replace(" benchmarks", "").replace(" bench ", " "))
    return "\n\n".join(kept)


def provenance(minimal: bool = False) -> str:
    """TEMPLATE.md: the template's version, commit and whether it had uncommitted changes."""
    init = (ROOT / "src" / OLD / "__init__.py").read_text()
    found = re.search(r"""__version__\s*=\s*["']([^"']+)""", init)
    version = found.group(1) if found else "unknown"
    try:
        commit = git("rev-parse", "HEAD", cwd=ROOT).strip()
        dirty = "yes" if git("status", "--porcelain", cwd=ROOT).strip() else "no"
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown (not a git checkout)", "unknown"
    return (
        f"# Template\n\nThis project was made with `scripts/new_project.py` from the `{OLD}` "
        f"template.\n\n- version: {version}\n- commit: {commit}\n"
        f"- uncommitted changes in the template: {dirty}\n"
    ) + (MINIMAL_NOTE if minimal else "")


MINIMAL_NOTE = """
Made with `--minimal`: the recipes (src/<package>/recipes/, the whitened_cnn and resnet9
models, experiment=cifar10_airbench and cifar10_speedrun) and the benchmarks (benchmarks/,
conf/suite/, `make bench`) were left out. The docs still describe them; the template has them.
"""


def locked(name: str) -> str:
    """A project name as uv writes it in uv.lock: my_exp becomes my-exp."""
    return re.sub(r"[-_.]+", "-", name).lower()


def rename(text: str, rel: str, name: str) -> str:
    """The file's text with the package renamed; in uv.lock only the project's own entry."""
    if rel == "uv.lock":
        return text.replace(f'\nname = "{locked(OLD)}"\n', f'\nname = "{locked(name)}"\n')
    return WORD.sub(name, ENV_PREFIX.sub(f"{name.upper()}_", text))


def copy_project(name: str, dest: Path, minimal: bool = False) -> int:
    """Copy and rename every template file into dest; returns how many were written."""
    files = [rel for rel in template_files() if not (minimal and is_recipe_or_benchmark(rel))]
    for rel in files:
        source, target = ROOT / rel, dest / WORD.sub(name, rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():  # conf -> src/repro/conf: renamed like a path
            target.symlink_to(WORD.sub(name, str(source.readlink())))
            continue
        try:
            text = rename(source.read_text(encoding="utf-8"), rel, name)
            if minimal and rel == "Makefile":
                text = without_benchmarks(text)
            target.write_text(text, "utf-8")
        except UnicodeDecodeError:  # a binary file: copied as it is
            shutil.copyfile(source, target)
        shutil.copymode(source, target)
    (dest / "TEMPLATE.md").write_text(provenance(minimal), encoding="utf-8")
    return len(files) + 1


def engine_version() -> str:
    init = (ROOT / "src" / OLD / "__init__.py").read_text()
    found = re.search(r"""__version__\s*=\s*["']([^"']+)""", init)
    return found.group(1) if found else "unknown"


def template_commit() -> str:
    try:
        commit = git("rev-parse", "--short=12", "HEAD", cwd=ROOT).strip()
        return commit + ("-dirty" if git("status", "--porcelain", cwd=ROOT).strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def build_engine(into: Path) -> str:
    """A wheel of this checkout's engine in `into`; returns its file name. The project keeps it
    (a few hundred kB), so that uv.lock pins the engine by hash and a fresh clone sets up with
    no access to this template."""
    uv = shutil.which("uv")
    if uv is None:
        raise RefusedError("uv is needed to build the engine's wheel (pip install uv)")
    done = subprocess.run(
        [uv, "build", "--wheel", "--quiet", "--out-dir", str(into), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    (into / ".gitignore").unlink(missing_ok=True)  # uv's own, "*": the project commits the wheel
    wheels = sorted(into.glob(f"{OLD}-*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        raise RefusedError(f"could not build the engine's wheel: {done.stderr.strip()[-500:]}")
    return wheels[0].name


def lock(dest: Path) -> None:
    """uv.lock for the project. The template's lock is put there first: uv keeps the versions
    it pins where they fit (what this machine's cache holds, what the engine is tested with)."""
    shutil.copyfile(ROOT / "uv.lock", dest / "uv.lock")
    done = subprocess.run(
        [shutil.which("uv") or "uv", "lock", "--quiet"], cwd=dest, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        raise RefusedError(f"uv lock failed in {dest}: {done.stderr.strip()[-500:]}")


def make_project(name: str, dest: Path) -> int:
    """The skeleton renamed to `name`, the engine's wheel and a lock; returns files written."""
    wheel = build_engine(dest / "engine")
    values = {
        "@ENGINE_VERSION@": engine_version(), "@ENGINE_WHEEL@": wheel,
        "@ENGINE_COMMIT@": template_commit(),
    }  # fmt: skip
    sources = sorted(p for p in SKELETON.rglob("*") if p.is_file() and is_kept_skeleton(p))
    for source in sources:
        rel = source.relative_to(SKELETON).as_posix()
        target = dest / SKELETON_WORD.sub(name, rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        text = SKELETON_WORD.sub(name, source.read_text(encoding="utf-8"))
        for placeholder, value in values.items():
            text = text.replace(placeholder, value)
        target.write_text(text, "utf-8")
    lock(dest)
    return len(sources) + 2  # and the wheel, the lock


def is_kept_skeleton(path: Path) -> bool:
    return not ({"__pycache__", ".pytest_cache", ".ruff_cache"} & set(path.parts))


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def pinned_ruff(dest: Path) -> str:
    """The ruff that `uv tool run` should fetch: the version the project's uv.lock pins (the one
    its `make lint` and CI check with), or the newest where the lock has none."""
    lock = dest / "uv.lock"
    text = lock.read_text(encoding="utf-8") if lock.is_file() else ""
    found = re.search(r'\nname = "ruff"\nversion = "([^"]+)"', text)
    return f"ruff@{found.group(1)}" if found else "ruff"


def ruff_commands(dest: Path) -> list[list[str]]:
    """The ways to run ruff here, the pinned version first: this interpreter's (the template's
    venv pins it); else `uv tool run` fetching the version uv.lock pins, since before `make
    setup` there is no venv and no ruff, but there is uv (setup needs it), and PyPI or uv's
    cache; last a ruff on PATH, whose version may format otherwise than the pinned one."""
    commands = [[sys.executable, "-m", "ruff"]] if has_module("ruff") else []
    uv = shutil.which("uv")
    if uv:
        commands.append([uv, "tool", "run", "--quiet", pinned_ruff(dest)])
    found = shutil.which("ruff")
    return commands + ([[found]] if found else [])


def format_code(dest: Path) -> str | None:
    """Format the renamed Python files with the project's own ruff settings: another name's
    length moves lines past the line length or lets them join, and `make lint` (the project's
    CI) checks the format. Returns a note when no ruff could be run (`make format` then does
    it, once `make setup` has installed ruff)."""
    folders = [
        folder for folder in ("src", "tests", "scripts", "benchmarks") if (dest / folder).is_dir()
    ]
    # The import order too: it sorts by the package's name.
    steps = (["format", "--quiet"], ["check", "--quiet", "--fix", "--select", "I"])
    for ruff in ruff_commands(dest):
        try:
            done = [
                subprocess.run([*ruff, *step, "--no-cache", *folders], cwd=dest,
                               capture_output=True, text=True, timeout=300).returncode
                for step in steps
            ]  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):  # gone, or uv waiting on a network
            continue
        if done == [0, 0]:
            return None
    return "ruff could not format the code (it comes with `make setup`): run `make format`"


def initial_commit(dest: Path) -> None:
    """git init and one commit; an identity is supplied only where git has none."""
    git("init", "--quiet", cwd=dest)
    git("add", "--all", cwd=dest)
    identity: list[str] = []
    for key, fallback in (("user.name", "new_project.py"), ("user.email", "new_project@localhost")):
        done = subprocess.run(["git", "config", key], cwd=dest, capture_output=True, text=True)
        if not done.stdout.strip():
            identity += ["-c", f"{key}={fallback}"]
    git(*identity, "commit", "--quiet", "-m", f"Start from the {OLD} template", cwd=dest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("name", help="the new package name, a Python identifier")
    parser.add_argument("--dest", type=Path, help="where to write it (default: ../NAME)")
    parser.add_argument(
        "--own-engine", action="store_true",
        help="copy the whole template, engine included, to edit the loop itself",
    )  # fmt: skip
    parser.add_argument(
        "--minimal", action="store_true",
        help="with --own-engine: the core alone, no recipes, no benchmarks",
    )  # fmt: skip
    args = parser.parse_args(argv)
    own_engine = args.own_engine or args.minimal
    dest = (args.dest or ROOT.parent / args.name).expanduser().absolute()
    try:
        check_name(args.name)
        check_dest(dest)
    except RefusedError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if own_engine:
        count = copy_project(args.name, dest, args.minimal)
        note = format_code(dest)
    else:
        try:
            count = make_project(args.name, dest)
        except RefusedError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        note = None
    try:
        initial_commit(dest)
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", "") or error
        print(f"error: {count} files written to {dest}, but git failed: {detail}", file=sys.stderr)
        return 1
    print(f"{dest}: {count} files, package {args.name}, one commit; next: cd {dest} && make test")
    if note:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
