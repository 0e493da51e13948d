"""Which ended jobs keep their ranks on the node: the newest few, so `oneplus logs` works right after the end."""

from __future__ import annotations

from collections import OrderedDict


class FinishedRanks:
    """Ended (job, token) attempts in the order they ended; beyond `keep`, the oldest are handed back for removal.

    Keyed by token as well as job: removing an old attempt must never touch the ranks of a newer one.
    """

    def __init__(self, keep: int) -> None:
        if keep < 0:
            raise ValueError(f"keep={keep}: the number of ended jobs to keep cannot be negative")
        self.keep = keep
        self._ended: OrderedDict[tuple[str, int], None] = OrderedDict()

    def ended(self, job_id: str, token: int) -> list[tuple[str, int]]:
        """Note that this attempt ended; returns the attempts to remove now, oldest first."""
        self._ended.pop((job_id, token), None)
        self._ended[(job_id, token)] = None
        drop: list[tuple[str, int]] = []
        while len(self._ended) > self.keep:
            oldest, _ = self._ended.popitem(last=False)
            drop.append(oldest)
        return drop

    def drain(self) -> list[tuple[str, int]]:
        """Every kept attempt, oldest first (on a clean shutdown nothing ended needs to outlive the executor)."""
        out = list(self._ended)
        self._ended.clear()
        return out

    def __contains__(self, item: object) -> bool:
        return item in self._ended

    def __len__(self) -> int:
        return len(self._ended)
