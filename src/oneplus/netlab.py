"""Hosts on one machine: Linux network namespaces joined by veth pairs to one bridge, made and removed by the caller.

Each host is a namespace with its own loopback and one interface (`eth0`) on a private /24; the bridge, in the
caller's namespace, holds the subnet's .1, so the caller reaches every host and every host reaches every other,
and nothing goes over the machine's loopback. A host is cut off and healed by taking its `eth0` down and up again,
which is what a pulled cable or a dead top-of-rack port looks like to the processes on it.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's `ip`; `NetLab.available()` says whether this machine
can, and why not.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field


class NetLabError(RuntimeError):
    """A namespace, link or address could not be made: the `ip` command and what it printed."""


def _ip(*args: str, netns: str | None = None) -> None:
    argv = ["ip", *(["netns", "exec", netns, "ip"] if netns else []), *args]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise NetLabError(f"{' '.join(argv)}: {(out.stderr or out.stdout).strip()}")


@dataclass
class Host:
    name: str  # the lab's name for it (nats-1, ctl, ...)
    netns: str  # the namespace's name on this machine
    address: str  # its address on the lab's subnet
    veth: str  # the bridge side of its veth pair

    def argv(self, argv: list[str]) -> list[str]:
        """`argv` run on this host (`ip netns exec` replaces itself with the command: the pid is the command's)."""
        return ["ip", "netns", "exec", self.netns, *argv]


@dataclass
class NetLab:
    """Namespaced hosts on a bridge. `tag` keeps two labs on one machine apart (names and a subnet of their own)."""

    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    hosts: dict[str, Host] = field(default_factory=dict)
    made: bool = False

    @staticmethod
    def available() -> str | None:
        """None when this machine can make a lab, else why not (one line)."""
        if shutil.which("ip") is None:
            return "iproute2's `ip` is not installed"
        if os.geteuid() != 0:
            return "network namespaces need root"
        probe = f"opprobe{secrets.token_hex(2)}"
        try:
            _ip("netns", "add", probe)
        except NetLabError as exc:
            return f"cannot make a network namespace: {exc}"
        with contextlib.suppress(NetLabError):
            _ip("netns", "del", probe)
        return None

    @property
    def bridge(self) -> str:
        return f"opbr{self.tag}"

    @property
    def subnet_prefix(self) -> str:
        """10.X.Y. from the tag: two labs at once do not share a subnet (one in 65,536 chance)."""
        n = int(self.tag, 16)
        return f"10.{100 + n % 100}.{n // 100 % 250}."

    @property
    def gateway(self) -> str:
        return self.subnet_prefix + "1"

    def up(self, names: list[str]) -> NetLab:
        """The bridge and one host per name (addresses .10, .11, ... in order)."""
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self.made = True
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, name in enumerate(names):
                self.add_host(name, self.subnet_prefix + str(10 + i), i)
        except Exception:
            self.down()
            raise
        return self

    def add_host(self, name: str, address: str, index: int) -> Host:
        netns = f"op{self.tag}-{name}"
        veth, peer = f"op{self.tag}v{index}", f"op{self.tag}p{index}"
        _ip("netns", "add", netns)
        host = Host(name, netns, address, veth)
        self.hosts[name] = host
        _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", netns)
        _ip("link", "set", veth, "master", self.bridge)
        _ip("link", "set", veth, "up")
        _ip("link", "set", "lo", "up", netns=netns)
        _ip("link", "set", peer, "name", "eth0", netns=netns)
        _ip("addr", "add", f"{address}/24", "dev", "eth0", netns=netns)
        _ip("link", "set", "eth0", "up", netns=netns)
        return host

    def cut(self, name: str) -> None:
        """Cut a host off the network (its processes run on, and see every peer time out)."""
        _ip("link", "set", self.hosts[name].veth, "down")

    def heal(self, name: str) -> None:
        _ip("link", "set", self.hosts[name].veth, "up")

    def down(self) -> None:
        """Remove every namespace and the bridge (the veth pairs go with their namespaces)."""
        for host in self.hosts.values():
            with contextlib.suppress(NetLabError):
                _ip("netns", "del", host.netns)
        self.hosts.clear()
        if self.made:
            with contextlib.suppress(NetLabError):
                _ip("link", "del", self.bridge)
            self.made = False

    def __enter__(self) -> NetLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()
