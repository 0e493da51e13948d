"""Slurm --nodelist / --exclude as a filter on which nodes a job may use (part of a node's eligibility)."""

from __future__ import annotations

from dataclasses import dataclass

from oneplus_contracts import JobSpec
from oneplus_contracts.slurm import compress_hostlist


@dataclass(frozen=True)
class HostFilter:
    """`only`: the nodes the job may use (None: any); `never`: nodes it must not use."""

    only: frozenset[str] | None = None
    never: frozenset[str] = frozenset()

    @classmethod
    def of(cls, spec: JobSpec) -> HostFilter | None:
        """The spec's filter, or None when it names no nodes (the common case: no cache key grows)."""
        if not spec.nodelist and not spec.exclude_nodes:
            return None
        return cls(frozenset(spec.nodelist) if spec.nodelist else None, frozenset(spec.exclude_nodes))

    def allows(self, node: str) -> bool:
        return node not in self.never and (self.only is None or node in self.only)

    @property
    def text(self) -> str:
        """How an explanation names the filter: 'on nodes a,b' / 'off nodes c'."""
        parts = []
        if self.only is not None:
            parts.append(f"on nodes {compress_hostlist(self.only)}")
        if self.never:
            parts.append(f"off nodes {compress_hostlist(self.never)}")
        return " and ".join(parts)
