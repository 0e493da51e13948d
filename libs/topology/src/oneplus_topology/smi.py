"""Read the text of `nvidia-smi topo -m` (or `topo --matrix`) into a `NodeTopology`.

Accepted: tab- or space-aligned columns, CRLF, prompt and `#` comment lines before the matrix, NIC columns named
`NIC<n>` (resolved through the "NIC Legend") or by device (`mlx5_0`), NIC rows or none, the columns `CPU Affinity`,
`NUMA Affinity` and `GPU NUMA ID` in any subset, `N/A` values, and the older `SOC` spelling of `SYS`.
A multi-node NUMA affinity such as `0,2-17` (Grace: CPU node plus GPU memory nodes) maps to its first node.
Without a `NUMA Affinity` column (older drivers), each distinct, disjoint `CPU Affinity` list is one NUMA node,
numbered in the order of its lowest CPU (`0-31` is node 0, `32-63` node 1), as the kernel numbers sockets.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from oneplus_contracts import GpuInfo, GpuLink, NicInfo, NodeTopology

from .bandwidth import PCIE_TIER_FACTOR, link_gbps, nvlink_count
from .errors import TopologyParseError
from .gpu_models import find_model, model_spec

AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
NEAR_TIERS = frozenset({"PIX", "PXB"})
# NVLink counts above this are a switch fabric (each pair shows the GPU's own links), below it a direct mesh.
MAX_NVLINKS_PER_GPU = 18

_GPU_RE = re.compile(r"^GPU(\d+)$")
_NV_RE = re.compile(r"^NV\d+$")
_CPU_LIST_RE = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
_NIC_LEGEND_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_MODEL_HINT_RE = re.compile(r"^#\s*gpu[_ ]model\s*:\s*(.+?)\s*$", re.IGNORECASE)
_AFFINITY_START = frozenset({"CPU", "NUMA", "GPU"})
_PCIE_KINDS = frozenset(PCIE_TIER_FACTOR)


@dataclass
class _Matrix:
    devices: list[str]
    n_gpus: int
    affinity_columns: list[str]
    header_line: int
    cells: dict[str, list[str]] = field(default_factory=dict)
    row_line: dict[str, int] = field(default_factory=dict)
    affinity: dict[str, dict[str, str]] = field(default_factory=dict)
    end: int = 0


def parse_topo_matrix(text: str, node: str = "node0") -> NodeTopology:
    """Parse `nvidia-smi topo -m` output; raise `TopologyParseError` naming the 1-based line of the first problem."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    header_at = _find_header(lines)
    matrix = _read_matrix(lines, header_at)
    legend = _read_nic_legend(lines, matrix.end)
    gpu_model = _gpu_model(lines[:header_at])
    return _build(matrix, legend, gpu_model, node)


def _find_header(lines: list[str]) -> int:
    first_content: int | None = None
    for i, line in enumerate(lines):
        tokens = line.split()
        if not tokens:
            continue
        if tokens[0] == "GPU0" and (len(tokens) == 1 or tokens[1] != "X"):
            return i
        if first_content is None and not line.lstrip().startswith(("#", ">")) and "nvidia-smi" not in line:
            first_content = i
    if first_content is None:
        raise TopologyParseError(len(lines) if lines else 1, "no nvidia-smi topo -m matrix: the input has no header")
    raise TopologyParseError(
        first_content + 1,
        f"expected the matrix header (GPU0 GPU1 ... CPU Affinity), got {lines[first_content].strip()[:60]!r}",
    )


def _split_header(tokens: list[str], lineno: int) -> tuple[list[str], list[str]]:
    devices: list[str] = []
    k = 0
    while k < len(tokens) and not (tokens[k] in _AFFINITY_START and not _GPU_RE.match(tokens[k])):
        devices.append(tokens[k])
        k += 1
    gpus = [d for d in devices if _GPU_RE.match(d)]
    if devices[: len(gpus)] != [f"GPU{i}" for i in range(len(gpus))]:
        raise TopologyParseError(lineno, f"GPU columns must come first as GPU0..GPU{len(gpus) - 1}, got {devices}")
    dupes = [d for d, c in Counter(devices).items() if c > 1]
    if dupes:
        raise TopologyParseError(lineno, f"column {dupes[0]} appears twice")
    rest = " ".join(tokens[k:])
    columns: list[str] = []
    while rest:
        name = next((c for c in AFFINITY_COLUMNS if rest.startswith(c)), None)
        if name is None:
            raise TopologyParseError(
                lineno, f"unknown column {rest.split()[0]!r}; known: {', '.join(AFFINITY_COLUMNS)}"
            )
        columns.append(name)
        rest = rest[len(name) :].strip()
    return devices, columns


def _read_matrix(lines: list[str], header_at: int) -> _Matrix:
    devices, columns = _split_header(lines[header_at].split(), header_at + 1)
    n_gpus = sum(1 for d in devices if _GPU_RE.match(d))
    m = _Matrix(devices, n_gpus, columns, header_at + 1)
    i = header_at + 1
    while i < len(lines):
        tokens = lines[i].split()
        if not tokens or tokens[0].rstrip(":") == "Legend":
            break
        _read_row(m, tokens, i + 1)
        i += 1
    m.end = i
    for g in devices[:n_gpus]:
        if g not in m.cells:
            raise TopologyParseError(i + 1, f"expected the row of {g}, found the end of the matrix")
    _check_symmetric(m)
    return m


def _read_row(m: _Matrix, tokens: list[str], lineno: int) -> None:
    name = tokens[0]
    if name not in m.devices:
        raise TopologyParseError(lineno, f"row {name!r} is not a column of the header (line {m.header_line})")
    if name in m.cells:
        raise TopologyParseError(lineno, f"row {name} appears twice")
    expected_gpu = f"GPU{len(m.cells)}" if len(m.cells) < m.n_gpus else None
    if expected_gpu and name != expected_gpu:
        raise TopologyParseError(lineno, f"expected the row of {expected_gpu}, got {name}")
    n = len(m.devices)
    cells = tokens[1 : 1 + n]
    if len(cells) < n:
        raise TopologyParseError(
            lineno,
            f"{name} has {len(cells)} cells, the header (line {m.header_line}) has {n} device columns: "
            + " ".join(m.devices),
        )
    me = m.devices.index(name)
    for j, cell in enumerate(cells):
        if (cell == "X") != (j == me):
            where = "on the diagonal" if j == me else f"between {name} and {m.devices[j]}"
            raise TopologyParseError(lineno, f"unexpected {cell!r} {where}")
        if cell != "X" and cell != "SOC" and cell not in _PCIE_KINDS and not _NV_RE.match(cell):
            raise TopologyParseError(
                lineno,
                f"unknown link type {cell!r} between {name} and {m.devices[j]}: expected NV<n>, PIX, PXB, PHB, NODE "
                "or SYS",
            )
    m.cells[name] = ["SYS" if c == "SOC" else c for c in cells]
    m.row_line[name] = lineno
    m.affinity[name] = _row_affinity(m, name, tokens[1 + n :], lineno)


def _row_affinity(m: _Matrix, name: str, values: list[str], lineno: int) -> dict[str, str]:
    if len(values) > len(m.affinity_columns):
        raise TopologyParseError(
            lineno, f"{name} has {len(values)} values after the matrix, the header names {len(m.affinity_columns)}"
        )
    out = dict(zip(m.affinity_columns, values, strict=False))
    for column, value in out.items():
        if value != "N/A" and not _CPU_LIST_RE.match(value):
            raise TopologyParseError(lineno, f"{column} of {name} is {value!r}, expected a list like 0-47,96-143")
    return out


def _check_symmetric(m: _Matrix) -> None:
    for name, cells in m.cells.items():
        i = m.devices.index(name)
        for j, other in enumerate(m.devices):
            if j <= i or other not in m.cells:
                continue
            if m.cells[other][i] != cells[j]:
                raise TopologyParseError(
                    m.row_line[other],
                    f"{other}->{name} is {m.cells[other][i]} but {name}->{other} is {cells[j]} "
                    f"(line {m.row_line[name]}): the matrix must be symmetric",
                )


def _read_nic_legend(lines: list[str], start: int) -> dict[str, str]:
    legend: dict[str, str] = {}
    for line in lines[start:]:
        hit = _NIC_LEGEND_RE.match(line)
        if hit:
            legend[hit.group(1)] = hit.group(2)
    return legend


def _gpu_model(preamble: list[str]) -> str:
    comments = [ln for ln in preamble if ln.lstrip().startswith("#")]
    for line in comments:
        hint = _MODEL_HINT_RE.match(line.strip())
        if hint:
            spec = model_spec(hint.group(1))
            return spec.name if spec else hint.group(1)
    ordered = [ln for ln in comments if "system" in ln.lower()] + comments
    for line in ordered:
        spec = find_model(line)
        if spec:
            return spec.name
    return "unknown"


def first_numa(value: str | None) -> int | None:
    """`0,2-17` -> 0; `N/A` or nothing -> None."""
    if not value or value == "N/A":
        return None
    return int(re.split(r"[,-]", value)[0])


def _cpu_set(text: str) -> frozenset[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(cpus)


def numa_from_cpu_affinity(cpu_lists: list[str | None]) -> list[int | None]:
    """NUMA nodes from CPU affinity when no NUMA column was printed: one node per distinct CPU list, numbered by its
    lowest CPU. Lists that overlap without being equal say nothing certain: then every node stays unknown."""
    sets = [None if c in (None, "N/A") else _cpu_set(c) for c in cpu_lists]
    distinct = sorted({s for s in sets if s}, key=min)
    for i, a in enumerate(distinct):
        if any(a & b for b in distinct[i + 1 :]):
            return [None] * len(cpu_lists)
    index = {s: n for n, s in enumerate(distinct)}
    return [index.get(s) if s else None for s in sets]


def cpu_count(cpu_lists: list[str]) -> int | None:
    """CPUs in the union of affinity lists such as `0-51,104-155`; None when no list is known."""
    cpus: set[int] = set()
    for text in cpu_lists:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    return len(cpus) if cpus else None


def nvlinks_per_gpu(peer_links: list[int], gpu_model: str) -> int:
    """A GPU's own NVLinks from its per-peer counts: their sum on a mesh, the common count behind an NVSwitch."""
    spec = model_spec(gpu_model)
    limit = spec.nvlinks_max if spec and spec.nvlinks_max else MAX_NVLINKS_PER_GPU
    total = sum(peer_links)
    return total if total <= limit else max(peer_links)


def _build(m: _Matrix, legend: dict[str, str], gpu_model: str, node: str) -> NodeTopology:
    gpu_names = m.devices[: m.n_gpus]
    nic_cols = m.devices[m.n_gpus :]
    numa = [first_numa(m.affinity[g].get("NUMA Affinity")) for g in gpu_names]
    cpu_lists = [m.affinity[g].get("CPU Affinity") for g in gpu_names]
    if "NUMA Affinity" not in m.affinity_columns:
        numa = numa_from_cpu_affinity(cpu_lists)
    links = [
        GpuLink(a=a, b=b, kind=k, nvlinks=nvlink_count(k), gbps=link_gbps(k, gpu_model))
        for a in range(m.n_gpus)
        for b in range(a + 1, m.n_gpus)
        for k in [m.cells[gpu_names[a]][b]]
    ]
    nics = [
        _nic(legend.get(col, col), [m.cells[g][m.n_gpus + c] for g in gpu_names], numa)
        for c, col in enumerate(nic_cols)
    ]
    switches = pcie_switch_ids(m.n_gpus, links, nics)
    gpus = []
    for i in range(m.n_gpus):
        total = nvlinks_per_gpu([lk.nvlinks for lk in links if i in (lk.a, lk.b)], gpu_model)
        cpu = cpu_lists[i]
        gpus.append(
            GpuInfo(
                index=i,
                name=gpu_model,
                numa_node=numa[i],
                cpu_affinity=None if cpu in (None, "N/A") else cpu,
                pcie_switch=switches.get(i),
                nvlinks_total=total,
                nvlinks_active=total,
            )
        )
    known_cpus = [g.cpu_affinity for g in gpus if g.cpu_affinity]
    extra: dict[str, int] = {}
    count = cpu_count(sorted(set(known_cpus)))
    if count:
        extra["cpus"] = count
    return NodeTopology(node=node, gpu_model=gpu_model, gpus=gpus, links=links, nics=nics, source="nvidia-smi", **extra)


def _nic(name: str, tiers: list[str], gpu_numa: list[int | None]) -> NicInfo:
    near = [g for g, t in enumerate(tiers) if t in NEAR_TIERS]
    same_node = Counter(gpu_numa[g] for g, t in enumerate(tiers) if t != "SYS" and gpu_numa[g] is not None)
    return NicInfo(
        name=name,
        numa_node=same_node.most_common(1)[0][0] if same_node else None,
        near_gpus=near,
        gpu_tiers=dict(enumerate(tiers)),
    )


def pcie_switch_ids(n_gpus: int, links: list[GpuLink], nics: list[NicInfo]) -> dict[int, str]:
    """Name the PCIe switch above each GPU: GPUs at PIX/PXB from each other, or from one NIC, share a switch."""
    parent = list(range(n_gpus))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    under_switch: set[int] = set()
    pairs = [(lk.a, lk.b) for lk in links if lk.kind in NEAR_TIERS]
    for nic in nics:
        pairs += [(nic.near_gpus[0], g) for g in nic.near_gpus[1:]]
        under_switch.update(nic.near_gpus)
    for a, b in pairs:
        under_switch.update((a, b))
        parent[find(a)] = find(b)
    roots: dict[int, str] = {}
    out: dict[int, str] = {}
    for g in sorted(under_switch):
        out[g] = roots.setdefault(find(g), f"pcie{len(roots)}")
    return out


def render_topo_matrix(topo: NodeTopology, sep: str = "\t") -> str:
    """Print a `NodeTopology` the way `nvidia-smi topo -m` does (with `sep` between cells), legend included."""
    n = len(topo.gpus)
    kinds = {(lk.a, lk.b): lk.kind for lk in topo.links} | {(lk.b, lk.a): lk.kind for lk in topo.links}
    nic_cols = [f"NIC{k}" for k in range(len(topo.nics))]
    header = ["", *[f"GPU{i}" for i in range(n)], *nic_cols, "CPU Affinity", "NUMA Affinity"]
    out = [f"# System: {n}x {topo.gpu_model}", "", sep.join(header)]
    for i, g in enumerate(topo.gpus):
        row = [f"GPU{i}", *[" X " if j == i else kinds[(i, j)] for j in range(n)]]
        row += [nic.gpu_tiers.get(i, "SYS") for nic in topo.nics]
        row += [g.cpu_affinity or "N/A", "N/A" if g.numa_node is None else str(g.numa_node)]
        out.append(sep.join(row))
    for k, nic in enumerate(topo.nics):
        row = [f"NIC{k}", *[nic.gpu_tiers.get(i, "SYS") for i in range(n)]]
        row += [" X " if j == k else _nic_pair_tier(nic, other) for j, other in enumerate(topo.nics)]
        out.append(sep.join(row))
    out += ["", "Legend:", "", "  X    = Self", "  NV#  = Connection traversing a bonded set of # NVLinks"]
    if topo.nics:
        out += ["", "NIC Legend:", ""] + [f"  NIC{k}: {nic.name}" for k, nic in enumerate(topo.nics)]
    return "\n".join(out) + "\n"


def _nic_pair_tier(a: NicInfo, b: NicInfo) -> str:
    # NIC-to-NIC tiers are not kept in the model; PIX when both hang under the same GPUs' switch, else SYS.
    return "PIX" if a.near_gpus and a.near_gpus == b.near_gpus else "SYS"
