"""What each node says runs on it: the node's own account of its ranks, the last line of defence against double use.

A reservation says who may use a GPU; a node's heartbeat says who does. After a store reset, a lease that ran out or
a requeue whose old ranks are still stopping, the two disagree for a while: a GPU counts as free only when the
store frees it and no node still reports a rank on it (or the node was declared lost). Pure: fed by the solver.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

from oneplus_contracts import Allocation, NodeHeartbeat, RankReport
from pydantic import BaseModel, ConfigDict, Field

ENDED_MEMORY_S = 600.0  # how long at most a rank's reported end outweighs an older heartbeat that still lists it


class HeartbeatRanks(BaseModel):
    """The part of a `NodeHeartbeat` read here: GPU and engine health are the registry's. Parsed from a heartbeat in
    about a third of the time of the whole message (4,096 nodes send 800 a second to the solver)."""

    model_config = ConfigDict(extra="ignore")

    node: str
    ts: float
    ranks: list[RankReport] = Field(default_factory=list)


class NodeReports:
    def __init__(self, ended_memory_s: float = ENDED_MEMORY_S) -> None:
        self.ended_memory_s = ended_memory_s
        self.ranks: dict[str, dict[str, tuple[int, tuple[int, ...]]]] = {}  # node → job → (token, GPUs)
        self.last_ts: dict[str, float] = {}
        self.ended: OrderedDict[tuple[str, int, str], float] = OrderedDict()  # (job, token, node) → when, oldest first
        # node → (job, token) → when the node reported the end, by the node's clock (its heartbeats' clock)
        self._ended_on: dict[str, dict[tuple[str, int], float]] = {}

    def report(self, hb: NodeHeartbeat | HeartbeatRanks) -> None:
        """A heartbeat: the node's ranks as of `hb.ts` (an older heartbeat arriving late changes nothing)."""
        if hb.ts < self.last_ts.get(hb.node, 0.0):
            return
        self.last_ts[hb.node] = hb.ts
        if hb.ranks:
            self.ranks[hb.node] = {r.job_id: (r.token, tuple(r.gpus)) for r in hb.ranks}
        else:  # kept for the nodes running something only: `lingering` walks them every cycle
            self.ranks.pop(hb.node, None)
        # A heartbeat taken after the node reported an end no longer lists those ranks (a node reports an end only
        # once they exited): the end has nothing left to outweigh. Forgotten now, the memory follows the ranks
        # ending within a heartbeat, not every end of the last ENDED_MEMORY_S.
        ends = self._ended_on.get(hb.node)
        if ends:
            for (job_id, token), at in list(ends.items()):
                if at < hb.ts:
                    del ends[(job_id, token)]
                    self.ended.pop((job_id, token, hb.node), None)

    def rank_ended(self, job_id: str, token: int, node: str, now: float, reported_ts: float | None = None) -> None:
        """The node reported the end of these ranks (it reports only after they exited) at `reported_ts` by its own
        clock (None: not known; the end is then kept for `ended_memory_s`)."""
        self.ended[(job_id, token, node)] = now
        self.ended.move_to_end((job_id, token, node))
        if reported_ts is not None:
            self._ended_on.setdefault(node, {})[(job_id, token)] = reported_ts
        while self.ended:
            key, when = next(iter(self.ended.items()))
            if now - when <= self.ended_memory_s:
                break
            del self.ended[key]
            ends = self._ended_on.get(key[2])
            if ends is not None:
                ends.pop((key[0], key[1]), None)

    def node_lost(self, node: str) -> None:
        """A node declared lost runs nothing the platform counts on: its ranks are over."""
        self.ranks.pop(node, None)
        self.last_ts.pop(node, None)

    def lingering(self, held: Mapping[str, tuple[int, Allocation]]) -> dict[str, set[int]]:
        """node → GPUs on which the node still reports ranks of an attempt that holds no reservation."""
        out: dict[str, set[int]] = {}
        for node, ranks in self.ranks.items():
            for job_id, (token, gpus) in ranks.items():
                current = held.get(job_id)
                if current is not None and current[0] == token:
                    continue  # a holder: its GPUs are held anyway
                if (job_id, token, node) in self.ended:
                    continue  # an old heartbeat: the node has since reported these ranks ended
                out.setdefault(node, set()).update(gpus)
        return out
