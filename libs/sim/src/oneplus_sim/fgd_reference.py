"""The reference simulator's own FGD workloads, to replay exactly what its published per-seed results ran.

Python's random streams draw other arrivals and node names than Go's for the same seed, so a ten-seed mean of ours and
the published one differ by luck as much as by policy (docs/simulator.md). `bench/fgd_reference` draws each seed's
workload with Go's math/rand in the reference's order (hkust-adsl/kubernetes-scheduler-simulator @8f3d6417) and writes
it as JSON lines: a header naming the pod and node lists it was drawn from (with their SHA-256) and the demand, then
per seed the arrivals (row indices of the pod list; after `originals` of them come tuned copies, named as the
reference names them) and the node ranks (for the nodes sorted by name, the reference's name prefix). Files for seeds
42-51 of the openb lists are in data/traces/openb/reference_arrivals.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .fgd import FgdInputError, Node, Pod, Workload


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        raise FgdInputError(f"{path}: no such arrivals file")
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        return raw.decode("utf-8").splitlines()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise FgdInputError(f"{path}: not a readable arrivals file ({exc})") from None


def _json(path: Path, n: int, line: str) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise FgdInputError(f"{path}:{n}: not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise FgdInputError(f"{path}:{n}: expected a JSON object")
    return obj


def _sha256(path: Path | str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_reference_workloads(
    path: Path | str,
    nodes_path: Path | str,
    pods_path: Path | str,
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    demand: float,
) -> dict[int, Workload]:
    """Seed → workload, from a file of `bench/fgd_reference` drawn from exactly these lists at this demand."""
    p = Path(path)
    lines = [(n, line) for n, line in enumerate(_lines(p), 1) if line.strip()]
    if not lines:
        raise FgdInputError(f"{p}: the arrivals file is empty")
    head = _json(p, *lines[0])
    for key, list_path in (("pods", pods_path), ("nodes", nodes_path)):
        want = head.get(f"{key}_sha256")
        if want != _sha256(list_path):
            raise FgdInputError(
                f"{p}: drawn from the {key} list {head.get(key)!r} (sha256 {str(want)[:12]}…), "
                f"not from {list_path}: its arrivals would name other rows"
            )
    if head.get("demand") != demand:
        raise FgdInputError(f"{p}: drawn for --demand {head.get('demand')}, not {demand}")
    # Node ranks are given for the nodes sorted by name; `nodes` is in the list's order.
    by_name = sorted(range(len(nodes)), key=lambda i: nodes[i].name)
    out: dict[int, Workload] = {}
    for n, line in lines[1:]:
        obj = _json(p, n, line)
        try:
            seed, rows, originals, ranks = int(obj["seed"]), obj["arrivals"], int(obj["originals"]), obj["node_rank"]
        except (KeyError, TypeError, ValueError):
            raise FgdInputError(f"{p}:{n}: a seed line needs seed, arrivals, originals and node_rank") from None
        if seed in out:
            raise FgdInputError(f"{p}:{n}: seed {seed} is given twice")
        if not isinstance(rows, list) or not all(isinstance(r, int) and 0 <= r < len(pods) for r in rows):
            raise FgdInputError(f"{p}:{n}: seed {seed}'s arrivals must be row numbers of the {len(pods)} pods")
        if not 0 <= originals <= len(rows):
            raise FgdInputError(f"{p}:{n}: seed {seed}: originals {originals} is not within its {len(rows)} arrivals")
        if not isinstance(ranks, list) or sorted(ranks) != list(range(len(nodes))):
            raise FgdInputError(f"{p}:{n}: seed {seed}'s node_rank must rank the {len(nodes)} nodes, each once")
        node_rank = [0] * len(nodes)
        for k, i in enumerate(by_name):
            node_rank[i] = ranks[k]
        arrivals = [pods[r] for r in rows[:originals]]
        # Tuned copies as the reference names them: "<pod>-tuned-<i>", i counting from 0.
        tuned = enumerate(rows[originals:])
        arrivals += [Pod(f"{pods[r].name}-tuned-{k}", pods[r].res, pods[r].memory) for k, r in tuned]
        out[seed] = Workload(seed, tuple(arrivals), tuple(node_rank), source="reference")
    if not out:
        raise FgdInputError(f"{p}: the arrivals file has no seed")
    return out
