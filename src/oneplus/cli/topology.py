"""`oneplus topology`: read `nvidia-smi topo -m` files, list presets, summarise a cluster YAML."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from .render import error_console, print_whole

# oneplus_topology builds the contracts' pydantic models on import: the commands import it, `oneplus --help` not.
if TYPE_CHECKING:
    from oneplus_contracts import NodeTopology

app = typer.Typer(no_args_is_help=True)
console = Console()
err = error_console()

_STYLE = {"PIX": "yellow", "PXB": "yellow", "PHB": "dark_orange", "NODE": "dark_orange", "SYS": "red"}


@app.callback()
def _topology() -> None:
    """Read and show node topologies."""


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/] {message}", highlight=False)
    return typer.Exit(2)


def _cell(kind: str) -> str:
    style = "green" if kind.startswith("NV") else _STYLE.get(kind)
    return f"[{style}]{kind}[/]" if style else kind


def render_link_matrix(topo: NodeTopology) -> Table:
    """The GPU x GPU and GPU x NIC matrix of one node as `nvidia-smi topo -m` lays it out; legend in the caption."""
    kinds = {(lk.a, lk.b): lk.kind for lk in topo.links} | {(lk.b, lk.a): lk.kind for lk in topo.links}
    table = Table(
        title=f"{topo.node}: {len(topo.gpus)}x {topo.gpu_model}",
        caption=_caption(topo),
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
    )
    headers = ["", *[f"GPU{g.index}" for g in topo.gpus], *[f"NIC{k}" for k in range(len(topo.nics))], "NUMA"]
    for h in headers:
        table.add_column(h, no_wrap=True, min_width=len(h) or 4)
    for g in topo.gpus:
        label = f"GPU{g.index}"
        if g.nvlinks_active < g.nvlinks_total:
            label += f" [red]{g.nvlinks_active}/{g.nvlinks_total} NVLinks up[/]"
        if not g.healthy:
            label += " [red]unhealthy[/]"
        cells = [" X " if h.index == g.index else _cell(kinds.get((g.index, h.index), "?")) for h in topo.gpus]
        cells += [_cell(nic.gpu_tiers.get(g.index, "-")) for nic in topo.nics]
        table.add_row(label, *cells, "-" if g.numa_node is None else str(g.numa_node))
    return table


def print_link_matrix(out: Console, topo: NodeTopology) -> None:
    """The matrix, then its legend lines (NVLink groups, NUMA, PCIe switches, rails, NICs), none of them cut: piped,
    the table is printed at its full width and each legend line stays one line (`nodes show a100-0 | cat`)."""
    from .render import print_lines, print_whole

    table = render_link_matrix(topo)
    table.caption = None
    print_whole(out, table)
    print_lines(out, _caption(topo))


def _mig_lines(topo: NodeTopology) -> list[str]:
    """One line per GPU in MIG mode: its instances (placement units of `resources.mig`), never NVLink group members."""
    out: list[str] = []
    for g in topo.gpus:
        if g.mig_instances:
            parts = ", ".join(f"{i.device}:{i.profile} {i.uuid}" for i in g.mig_instances)
            out.append(f"MIG GPU{g.index}: {parts}")
        elif g.mig_enabled:
            out.append(f"MIG GPU{g.index}: MIG mode, no instances")
    return out


def _caption(topo: NodeTopology) -> str:
    from oneplus_topology.analysis import numa_groups, nvlink_groups, pcie_switch_groups, rails
    from oneplus_topology.bandwidth import assumptions

    groups = nvlink_groups(topo)
    gbps = sorted({round(lk.gbps, 1) for lk in topo.links if lk.kind.startswith("NV")}, reverse=True)
    nv = ", ".join(str(g) for g in groups) + f" ({', '.join(f'{x:g}' for x in gbps)} GB/s)" if groups else "none"
    lines = [f"NVLink groups: {nv}"]
    for numa, gpus in numa_groups(topo).items():
        cpus = next((g.cpu_affinity for g in topo.gpus if g.numa_node == numa and g.cpu_affinity), None)
        lines.append(f"NUMA {numa}: GPUs {gpus}" + (f", CPUs {cpus}" if cpus else ""))
    switches = pcie_switch_groups(topo)
    if switches:
        lines.append("PCIe switches: " + ", ".join(str(s) for s in switches))
    rail = {g: nics for g, nics in rails(topo).items() if nics}
    if rail:
        lines.append("Rails: " + ", ".join(f"GPU{g}: {'/'.join(n)}" for g, n in rail.items()))
    if topo.nics:
        lines.append("NICs: " + ", ".join(f"NIC{k}={nic.name}" for k, nic in enumerate(topo.nics)))
    lines += _mig_lines(topo)
    lines += [f"note: {a}" for a in assumptions(topo.gpu_model)]
    return "\n".join(lines)


def topology_json(topo: NodeTopology) -> dict[str, Any]:
    """The `topology import --json` document (schema in docs/topology.md)."""
    from oneplus_topology.analysis import nvlink_domains, nvlink_groups, pcie_switch_groups, rails
    from oneplus_topology.bandwidth import assumptions

    return {
        "node": topo.node,
        "gpu_model": topo.gpu_model,
        "gpus": len(topo.gpus),
        "links": [[lk.a, lk.b, lk.kind, round(lk.gbps, 3)] for lk in topo.links],
        "nvlink_groups": nvlink_groups(topo),
        "nvlink_domains": nvlink_domains(topo),
        "numa": [g.numa_node for g in topo.gpus],
        "cpu_affinity": [g.cpu_affinity for g in topo.gpus],
        "pcie_switches": pcie_switch_groups(topo),
        "nics": [{"name": n.name, "numa": n.numa_node, "near_gpus": n.near_gpus} for n in topo.nics],
        "mig": {
            str(g.index): [i.model_dump(mode="json") for i in g.mig_instances] for g in topo.gpus if g.mig_instances
        },
        "rails": {str(k): v for k, v in rails(topo).items()},
        "assumptions": assumptions(topo.gpu_model),
        "model": topo.model_dump(mode="json"),
    }


@app.command("import")
def import_(
    file: Annotated[Path, typer.Argument(help="`nvidia-smi topo -m` output saved as text")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    node: Annotated[str | None, typer.Option("--node", help="Node name (default: the file name)")] = None,
    gpu_list: Annotated[
        Path | None,
        typer.Option("--gpu-list", help="`nvidia-smi -L` output saved as text: GPU UUIDs and the MIG layout"),
    ] = None,
) -> None:
    """Read `nvidia-smi topo -m` text (and optionally `nvidia-smi -L`) and print the node model."""
    from oneplus_topology.errors import TopologyParseError
    from oneplus_topology.mig import apply_gpu_listing, parse_gpu_listing
    from oneplus_topology.smi import parse_topo_matrix

    try:
        text = file.read_text(encoding="utf-8")
    except OSError as e:
        raise _fail(f"{file}: cannot read: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise _fail(f"{file}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    try:
        topo = parse_topo_matrix(text, node=node or file.stem)
    except TopologyParseError as e:
        raise _fail(f"{file}: {e}") from e
    if gpu_list is not None:
        try:
            topo = apply_gpu_listing(topo, parse_gpu_listing(gpu_list.read_text(encoding="utf-8")))
        except OSError as e:
            raise _fail(f"{gpu_list}: cannot read: {e.strerror}") from e
        except (TopologyParseError, ValueError) as e:
            raise _fail(f"{gpu_list}: {e}") from e
    if as_json:
        print(json.dumps(topology_json(topo), indent=2))
    else:
        print_link_matrix(console, topo)  # a matrix reads only unwrapped: never cut, however many NICs


@app.command("presets")
def presets(as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False) -> None:
    """List the node layouts that ship with OnePlus."""
    from oneplus_topology.analysis import nvlink_groups
    from oneplus_topology.presets import CONSTRUCTED_PRESETS, PRESETS, shared_preset

    rows = [
        {
            "name": name,
            "gpus": len(t.gpus),
            "gpu_model": t.gpu_model,
            "nvlink_groups": nvlink_groups(t),
            "constructed": name in CONSTRUCTED_PRESETS,
        }
        for name in PRESETS
        for t in [shared_preset(name)]
    ]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="topology presets")
    for col in ("NAME", "GPUS", "MODEL", "NVLINK GROUPS", "SOURCE"):
        table.add_column(col)
    for r in rows:
        source = "constructed" if r["constructed"] else "real capture"
        table.add_row(str(r["name"]), str(r["gpus"]), str(r["gpu_model"]), str(r["nvlink_groups"] or "-"), source)
    print_whole(console, table)


@app.command("cluster")
def cluster(
    file: Annotated[Path, typer.Argument(help="Cluster YAML (docs/topology.md)")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Load a cluster YAML and show its nodes under leaves and spines."""
    from oneplus_topology.cluster import load_cluster
    from oneplus_topology.errors import ClusterConfigError

    try:
        c = load_cluster(file)
    except ClusterConfigError as e:
        raise _fail(str(e)) from e
    by_leaf = c.nodes_by_leaf()
    if as_json:
        doc = {
            "name": c.name,
            "fabric": c.fabric.model_dump(mode="json"),
            "nodes": len(c.nodes),
            "gpus": c.total_gpus,
            "leaves": {leaf: [n.node for n in nodes] for leaf, nodes in by_leaf.items()},
            "spines": {s: sorted({n.leaf or "-" for n in nodes}) for s, nodes in c.nodes_by_spine().items()},
            "nvlink_domains": {d: [n.node for n in nodes] for d, nodes in c.nodes_by_nvlink_domain().items()},
        }
        print(json.dumps(doc, indent=2))
        return
    table = Table(title=f"cluster {c.name}: {len(c.nodes)} nodes, {c.total_gpus} GPUs")
    for col in ("SPINE", "LEAF", "NODES", "MODELS"):
        table.add_column(col)
    for leaf, nodes in by_leaf.items():
        models = sorted({n.gpu_model for n in nodes})
        names = f"{nodes[0].node} .. {nodes[-1].node}" if len(nodes) > 2 else ", ".join(n.node for n in nodes)
        table.add_row(nodes[0].spine or "-", leaf, f"{len(nodes)}: {names}", ", ".join(models))
    print_whole(console, table)
