"""Print this machine's topology as NVML sees it: `python -m oneplus_topology.discover_cli [NODE] [--xid-wait-ms N]`.

Exit status 2 with a one-line reason when NVML cannot be used (no driver, no library).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

from .analysis import nvlink_domains, nvlink_groups, rails
from .errors import NvmlUnavailable
from .nvml import discover_node


def _host_memory_mb() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    except (ValueError, OSError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("node", nargs="?", default=socket.gethostname(), help="node name (default: host name)")
    parser.add_argument("--sysfs", default="/sys", help="sysfs root for NICs and NUMA (empty to skip)")
    parser.add_argument("--xid-wait-ms", type=int, default=0, help="also wait this long for XID error events")
    parser.add_argument("--summary", action="store_true", help="add NVLink groups, domains and rails to the output")
    args = parser.parse_args(argv)
    try:
        topo = discover_node(
            args.node,
            sysfs=Path(args.sysfs) if args.sysfs else None,
            cpus=os.cpu_count(),
            memory_mb=_host_memory_mb(),
            xid_wait_ms=args.xid_wait_ms,
        )
    except NvmlUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.summary:
        doc = topo.model_dump(mode="json")
        doc["summary"] = {
            "nvlink_groups": nvlink_groups(topo),
            "nvlink_domains": nvlink_domains(topo),
            "rails": rails(topo),
        }
        print(json.dumps(doc, indent=2))
    else:
        print(topo.model_dump_json(indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
