"""What an entry point does before Hydra parses anything; imports nothing heavy.

- PYTHONHASHSEED is read only when an interpreter starts, so if the user has not set it we
  set it and re-execute the entry point once; children inherit it.
- `seed=3` is shorthand for `seed.value=3` (seed is also a config group: fixed | random).
- A run id shared by this process and its children keeps output folders unique even for
  runs started in the same second.
"""

from __future__ import annotations

import os
import re
import secrets
import sys

DEFAULT_HASH_SEED = "0"
_SEED_GROUP_OPTIONS = {"fixed", "random"}
_SEED_ARG = re.compile(r"^seed=(.+)$")


def pin_hash_seed(module: str) -> None:
    """Re-exec `python -m module ...` with PYTHONHASHSEED set, unless it is set already."""
    if "PYTHONHASHSEED" in os.environ:
        return
    os.environ["PYTHONHASHSEED"] = DEFAULT_HASH_SEED
    os.execv(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]])


def expand_seed_shorthand(argv: list[str]) -> list[str]:
    """Rewrite `seed=<ints or a sweep of them>` to `seed.value=...`; leave group choices alone."""
    out = []
    for arg in argv:
        match = _SEED_ARG.match(arg)
        if match and not set(re.split(r"[,\s]+", match.group(1))) & _SEED_GROUP_OPTIONS:
            arg = f"seed.value={match.group(1)}"
        out.append(arg)
    return out


def run_id() -> str:
    """A short random id, the same in this process and in the workers it starts.

    Stored in the environment with the pid that made it, and reused only by that process
    (also after the re-exec above) or its direct children, never by an unrelated later run.
    """
    owner, _, token = os.environ.get("REPRO_RUN_ID", "").partition(":")
    if not token or owner not in (str(os.getpid()), str(os.getppid())):
        token = secrets.token_hex(3)
        os.environ["REPRO_RUN_ID"] = f"{os.getpid()}:{token}"
    return token
