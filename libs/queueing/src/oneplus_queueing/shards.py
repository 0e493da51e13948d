"""Which solver replica places which pending job: rendezvous (highest-random-weight) hashing over the live replicas.

Each replica places only the pending jobs it wins, so replicas do not race for the same gang; when a replica joins
or leaves, only the jobs it wins or won move (about 1/n of them), the rest stay where they were. Two replicas whose
views of the live set differ for a beat may both try a job: the atomic reservation lets one of them have it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def _weight(replica: str, job_id: str) -> int:
    digest = hashlib.blake2b(f"{replica}\x00{job_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def replica_for(job_id: str, replicas: Sequence[str]) -> str:
    """The replica that places `job_id` among `replicas` (not empty)."""
    if not replicas:
        raise ValueError("no replicas to place jobs")
    return max(replicas, key=lambda r: (_weight(r, job_id), r))
