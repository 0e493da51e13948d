"""Ports the embedded platform listens on are chosen below the kernel's ephemeral range, so an outgoing connection
cannot take one between the choice and the server's bind."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from oneplus import devstack


def test_ports_are_free_and_below_the_ephemeral_range() -> None:
    low = devstack.ephemeral_ports_from()
    ports = {devstack.free_port() for _ in range(50)}
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: this bind would raise otherwise
        if low is not None and low > devstack.LISTEN_PORTS_FROM + 1000:
            assert devstack.LISTEN_PORTS_FROM <= port < low
    assert len(ports) > 40, "spread over the range, not one port again and again"


def test_the_ephemeral_range_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    f = tmp_path / "ip_local_port_range"
    f.write_text("32768\t60999\n")
    assert devstack.ephemeral_ports_from(f) == 32768
    assert devstack.ephemeral_ports_from(tmp_path / "absent") is None
    f.write_text("garbage")
    assert devstack.ephemeral_ports_from(f) is None


def test_without_room_below_the_range_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devstack, "ephemeral_ports_from", lambda: 1024)
    port = devstack.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
