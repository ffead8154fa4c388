"""Tools that read files from others reach no network unless their command line says so.

`repro.evaluate`, `predict`, `export` and `verify` rebuild a run from a stored config. What
that config names may fetch things on its own (torchvision's weights, a dataset's download, a
hub): a file would then decide what this machine sends and to whom. Inside `offline(...)`,
a connection to another host, a name lookup, or a URL opened through urllib (a `file://` one
too: torch.hub would copy it into a folder the config names) is refused by an audit hook (the
places every socket and URL pass) with one `NetworkRefusedError` line, unless the user asked
for it (`download=true`). Local sockets (DataLoader workers' pipes) are not touched.
"""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import Iterator
from typing import Any

from repro.core.errors import UserError

_refusing: list[str] = []  # why, while a tool runs offline (a stack: nested blocks)
_installed = False


class NetworkRefusedError(UserError):
    """Something a file from someone else configured tried to reach the network."""


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _refusing:
        return
    if event == "socket.connect":
        sock, address = args
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        host = address[0]
    elif event in ("socket.getaddrinfo", "urllib.Request"):  # a URL: file:// too
        host = args[0]
    else:
        return
    raise NetworkRefusedError(
        f"reaching {host!r} over the network is refused: {_refusing[-1]}, and a file from "
        "someone else decides nothing this machine sends; to allow it, add download=true"
    )


@contextlib.contextmanager
def offline(why: str, allowed: bool = False) -> Iterator[None]:
    """Refuse every connection to another host inside the block, saying `why` (e.g. "the
    config comes from ckpt=X"); `allowed`: the command line asked for downloads."""
    global _installed
    if allowed is not True and allowed is not False:
        raise UserError(f"download={allowed!r} is not allowed: true or false")
    if allowed:
        yield
        return
    if not _installed:  # audit hooks cannot be removed: one, switched by `_refusing`
        sys.addaudithook(_audit)
        _installed = True
    _refusing.append(why)
    try:
        yield
    finally:
        _refusing.pop()
