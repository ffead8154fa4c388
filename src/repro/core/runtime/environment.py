"""What a run ran on: hardware, the libraries whose kernels compute its numbers, every direct
dependency, the source tree, PYTHONHASHSEED and the thread count. `verify` compares two of
these and marks the differences known to change floating-point results."""

from __future__ import annotations

import hashlib
import platform
import re
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path

import torch

from repro.core.runtime.seeding import python_hash_seed

SOURCE_DIR = Path(__file__).resolve().parents[2]  # src/repro/core/runtime/ -> src/repro
PROJECT_DIR = SOURCE_DIR.parents[1]  # the checkout: src/repro/ -> the folder holding uv.lock

# Keys whose difference alone can change a run's numbers: other kernels (CPU capability, the
# library versions), another device, another split of the sums over threads.
CHANGES_RESULTS = (
    "cpu_capability",
    "cpu_model",
    "torch",
    "torchvision",
    "onednn",
    "blas",
    "cuda",
    "cudnn",
    "nccl",
    "device",
    "device_name",
    "compute_capability",
    "gpu_driver",
    "num_threads",
)


def _run(*command: str, cwd: Path = SOURCE_DIR, exact: bool = False) -> str | None:
    """The command's output (stripped unless `exact`: a patch needs its last blank line);
    None if it cannot run or fails. `git diff --no-index` exits 1 when files differ."""
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode not in ((0, 1) if "--no-index" in command else (0,)):
        return None
    return done.stdout if exact else done.stdout.strip()


def _git(*args: str) -> str | None:
    return _run("git", *args)


@cache  # asked by the summary and the run history: once per process, for the code it imported
def git_commit() -> str | None:
    return _git("rev-parse", "HEAD")


@cache
def cpu_model() -> str:
    """The CPU's marketing name: two machines of one family can run different kernels."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.MULTILINE)
        if found:
            return found.group(1).strip()
    if platform.system() == "Darwin":
        name = _run("sysctl", "-n", "machdep.cpu.brand_string")
        if name:
            return name
    return platform.processor() or platform.machine()


@cache
def _build_libraries() -> dict[str, str | None]:
    """oneDNN and BLAS as torch reports them in its build description."""
    shown = torch.__config__.show()
    onednn = re.search(r"(?:MKL-DNN|oneDNN) (v[\d.]+)", shown)
    blas = re.search(r"BLAS_INFO=(\w+)", shown)
    mkl = re.search(r"Math Kernel Library Version ([\d.]+)", shown)
    blas_name = blas.group(1) if blas else None
    if blas_name == "mkl" and mkl:
        blas_name = f"mkl {mkl.group(1)}"
    return {"onednn": onednn.group(1) if onednn else None, "blas": blas_name}


def _cuda(device: torch.device) -> dict[str, object]:
    if device.type != "cuda":
        return {"compute_capability": None, "gpu_driver": None, "nccl": None}
    major, minor = torch.cuda.get_device_capability(device)
    driver = _run("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
    nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
    return {
        "compute_capability": f"{major}.{minor}",
        "gpu_driver": driver.splitlines()[0] if driver else None,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
    }


def _distribution() -> str | None:
    """The installed distribution that holds this package (renamed copies have their own)."""
    try:
        return metadata.distribution(SOURCE_DIR.name).name  # named as its package
    except metadata.PackageNotFoundError:
        pass
    names = metadata.packages_distributions().get(SOURCE_DIR.name)
    return names[0] if names else None


@cache
def dependencies() -> dict[str, str | None]:
    """The installed version of every direct dependency of the project."""
    dist = _distribution()
    required = (metadata.requires(dist) or []) if dist else []
    versions: dict[str, str | None] = {}
    for requirement in required:
        if "extra ==" in requirement:
            continue  # optional extras (dev tools, launchers) are not part of every run
        name = re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0]
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _lock_sha256() -> str | None:
    lock = PROJECT_DIR / "uv.lock"
    return hashlib.sha256(lock.read_bytes()).hexdigest() if lock.exists() else None


@cache
def source_patch(inside: Path = SOURCE_DIR) -> str | None:
    """The changes of the source tree holding `inside` against HEAD, untracked files under
    src/ and conf/ included, as one patch `git apply` takes; None if clean or outside git."""
    toplevel = _run("git", "rev-parse", "--show-toplevel", cwd=inside)
    if toplevel is None or _run("git", "rev-parse", "HEAD", cwd=inside) is None:
        return None
    top = Path(toplevel)
    diff = _run("git", "diff", "HEAD", "--binary", cwd=top, exact=True) or ""
    untracked = (
        _run("git", "ls-files", "--others", "--exclude-standard", "--", "src", "conf", cwd=top)
        or ""
    ).splitlines()
    if not diff and not untracked:
        return None
    parts = [f"# untracked files, included below: {', '.join(untracked)}\n"] if untracked else []
    parts.append(diff)
    for name in untracked:
        parts.append(
            _run("git", "diff", "--no-index", "--binary", "/dev/null", name, cwd=top, exact=True)
            or ""
        )
    return "".join(parts)


def describe(device: torch.device) -> dict[str, object]:
    """A plain dict for summary.json; verify compares two of these."""
    commit = git_commit()
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        # Read from package metadata: importing torchvision costs seconds at start-up.
        "torchvision": metadata.version("torchvision"),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        **_build_libraries(),
        "cpu_model": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "device": device.type,
        "device_name": device_name,
        **_cuda(device),
        "num_threads": torch.get_num_threads(),
        "pythonhashseed": python_hash_seed(),
        "packages": dependencies(),
        "uv_lock_sha256": _lock_sha256(),
        "git_commit": commit,
        "git_dirty": source_patch() is not None if commit else None,
    }
