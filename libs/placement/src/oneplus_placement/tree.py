"""The site's levels above the node, as one tree: every node's domain at each level, nested bottom-up.

A site names its levels from the bottom up (`nvlink`, `rack`, `leaf`, `spine`, `zone`, ...) in each node's
`NodeTopology.levels`; a node that names none has `nvlink` (when it is in a multi-node NVLink domain), `leaf` and
`spine`. `node` below and `cluster` above are implicit. A domain is read inside the domains above it (its key is its
name and every name above), so the levels always nest: a rack that a site cabled to two leaves is two domains here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from oneplus_contracts import NodeTopology


@dataclass(frozen=True, eq=False)
class Level:
    """One level of the tree: its domains (`names`), the nodes under each, and the domains one level down."""

    name: str
    names: tuple[str, ...]
    members: tuple[tuple[int, ...], ...]  # node indexes under each domain, in node order
    of_node: tuple[int, ...]  # each node's domain at this level
    children: tuple[tuple[int, ...], ...]  # each domain's domains one level down (empty for the lowest level)
    flat: tuple[bool, ...]  # whether every child holds a single node (the domain is filled node by node)

    def solo(self, node: int) -> bool:
        """Whether node `node` is alone in its domain at this level."""
        return len(self.members[self.of_node[node]]) == 1


def node_levels(topo: NodeTopology) -> list[tuple[str, str | None]]:
    """A node's (level, domain) pairs bottom-up; the well-known `nvlink`, `leaf`, `spine` from its fields when its
    `levels` do not name them."""
    named = dict(topo.levels)
    out: list[tuple[str, str | None]] = list(named.items())
    names = [n for n, _ in out]
    if "leaf" not in named:
        at = names.index("nvlink") + 1 if "nvlink" in named else 0
        out.insert(at, ("leaf", topo.leaf))
        names.insert(at, "leaf")
    if "spine" not in named:
        at = names.index("leaf") + 1
        out.insert(at, ("spine", topo.spine))
        names.insert(at, "spine")
    if "nvlink" not in named and topo.nvlink_domain is not None:
        out.insert(0, ("nvlink", topo.nvlink_domain))
    return out


def _merge_order(per_node: Sequence[Sequence[str]]) -> list[str]:
    """One bottom-up order of every level any node names: each name after the one below it on its node."""
    order: list[str] = []
    for names in per_node:
        prev: str | None = None
        for n in names:
            if n not in order:
                order.insert(order.index(prev) + 1 if prev is not None else 0, n)
            prev = n
    return order


def _default(level: str, node: str, below_leaf: bool) -> str:
    """The domain of a node that does not name one: its own below and at the leaf (as a node without a leaf always
    had), one shared domain above (as a node without a spine always had)."""
    if level == "leaf":
        return f"leaf-{node}"
    if level == "spine":
        return "spine-0"
    return f"{level}-{node}" if below_leaf else f"{level}-0"


def build_levels(nodes: Sequence[NodeTopology]) -> tuple[Level, ...]:
    per_node = [node_levels(t) for t in nodes]
    order = _merge_order([[n for n, _ in p] for p in per_node])
    below = set(order[: order.index("leaf")]) if "leaf" in order else set()
    values = []
    for topo, pairs in zip(nodes, per_node, strict=True):
        got = dict(pairs)
        values.append([got.get(lv) or _default(lv, topo.node, lv in below) for lv in order])
    levels: list[Level] = []
    for k, name in enumerate(order):
        keys: dict[tuple[str, ...], int] = {}
        of_node: list[int] = []
        members: list[list[int]] = []
        for i, vals in enumerate(values):
            key = tuple(vals[k:])
            g = keys.get(key)
            if g is None:
                g = keys[key] = len(keys)
                members.append([])
            of_node.append(g)
            members[g].append(i)
        plain = [key[0] for key in keys]
        repeated = {v for v in plain if plain.count(v) > 1}
        names = tuple(f"{key[1]}/{key[0]}" if key[0] in repeated and len(key) > 1 else key[0] for key in keys)
        if k == 0:
            children: list[tuple[int, ...]] = [() for _ in members]
            flat = [True] * len(members)
        else:
            below_of = levels[k - 1].of_node
            children = [tuple(dict.fromkeys(below_of[i] for i in m)) for m in members]
            lower = levels[k - 1].members
            flat = [all(len(lower[c]) == 1 for c in ch) for ch in children]
        levels.append(
            Level(
                name=name,
                names=names,
                members=tuple(map(tuple, members)),
                of_node=tuple(of_node),
                children=tuple(children),
                flat=tuple(flat),
            )
        )
    return tuple(levels)
