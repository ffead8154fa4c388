"""The network guard (repro.core.guards.network), in this process: inside `offline`, a connection
to another host, a name lookup and a URL are each refused in one line naming the host and
why; local sockets and anything outside the block are left alone."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from repro.core.errors import UserError
from repro.core.guards.network import NetworkRefusedError, offline

WHY = "the config comes from ckpt=/runs/a"


def _said(host: str, why: str = WHY) -> str:
    return (
        f"reaching {host!r} over the network is refused: {why}, and a file from someone else "
        "decides nothing this machine sends; to allow it, add download=true"
    )


def test_a_connection_to_another_host_is_refused_naming_it():
    sock = socket.socket(socket.AF_INET)
    with sock, offline(WHY), pytest.raises(NetworkRefusedError) as refused:
        sock.connect(("192.0.2.7", 9))  # refused before any packet leaves
    assert str(refused.value) == _said("192.0.2.7")


def test_a_name_lookup_and_a_url_are_refused_naming_what_they_reach(tmp_path):
    url = f"file://{tmp_path}/weights.pt"  # torch.hub would copy it where the config says
    with offline(WHY):
        with pytest.raises(NetworkRefusedError) as looked_up:
            socket.getaddrinfo("weights.example.org", 443)
        with pytest.raises(NetworkRefusedError) as opened:
            urllib.request.urlopen(url)
    assert str(looked_up.value) == _said("weights.example.org")
    assert str(opened.value) == _said(url)


def test_a_local_socket_and_everything_outside_the_block_are_left_alone(tmp_path):
    local = socket.socket(socket.AF_UNIX)
    with local, offline(WHY), pytest.raises(FileNotFoundError):  # the OS's answer, not ours
        local.connect(str(tmp_path / "no-such-socket"))
    assert socket.getaddrinfo("127.0.0.1", 80)  # after the block: no refusal
    (tmp_path / "weights.pt").write_bytes(b"w")
    asked = offline(WHY, allowed=True)  # the command line asked for downloads
    with asked, urllib.request.urlopen(f"file://{tmp_path}/weights.pt") as opened:
        assert opened.read() == b"w"


def test_a_nested_block_says_its_own_reason_and_the_outer_one_returns():
    with offline("outer"):
        with offline("inner"), pytest.raises(NetworkRefusedError) as inner:
            socket.getaddrinfo("a.example", 80)
        with pytest.raises(NetworkRefusedError) as outer:
            socket.getaddrinfo("b.example", 80)
    assert str(inner.value) == _said("a.example", "inner")
    assert str(outer.value) == _said("b.example", "outer")


def test_download_must_be_true_or_false():
    with pytest.raises(UserError) as refused, offline(WHY, allowed="yes"):
        pass
    assert str(refused.value) == "download='yes' is not allowed: true or false"
