"""Errors of the topology library: each names what was wrong and where."""

from __future__ import annotations


class TopologyParseError(ValueError):
    """`nvidia-smi topo -m` text that cannot be read; the message starts with the 1-based line number."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


class ClusterConfigError(ValueError):
    """A cluster YAML that cannot be used; the message names the file and the key."""


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine (no driver, no library): discovery refuses rather than invent a node."""
