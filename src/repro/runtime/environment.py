"""What a run ran on: library versions, device, git state, PYTHONHASHSEED, thread count."""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

from repro.runtime.seeding import python_hash_seed

SOURCE_DIR = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=SOURCE_DIR, capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def describe(device: torch.device) -> dict[str, object]:
    """A plain dict for summary.json; verify compares two of these."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = platform.processor() or platform.machine()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        # Read from package metadata: importing torchvision costs seconds at start-up.
        "torchvision": metadata.version("torchvision"),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": device.type,
        "device_name": device_name,
        "num_threads": torch.get_num_threads(),
        "pythonhashseed": python_hash_seed(),
        "git_commit": commit,
        "git_dirty": bool(status) if commit else None,
    }
