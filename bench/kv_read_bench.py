"""Whole-bucket read cost (`oneplus_bus.ledger.latest_values`): what the solver pays each cycle to read every job.

Fills a scratch KV bucket (history 5, like `jobs`) with records of `--size` bytes and times three reads at each
count. Uses NATS_URL when set, else the embedded nats-server; the scratch bucket is deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import nats
from oneplus_bus.ledger import latest_values

from oneplus.devstack import EmbeddedServers

BUCKET = "bench_kv_read"


async def bench(url: str, counts: list[int], size: int) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    kv = await js.create_key_value(bucket=BUCKET, history=5)
    body = b'{"x":"' + b"a" * max(0, size - 8) + b'"}'
    try:
        written = 0
        for count in counts:
            while written < count:
                batch = range(written, min(count, written + 500))
                await asyncio.gather(*(kv.put(f"j-{i:07d}", body) for i in batch))
                written = batch.stop
            times = []
            for _ in range(3):
                t = time.perf_counter()
                got = await latest_values(js, BUCKET)
                times.append(time.perf_counter() - t)
                assert len(got) == count, f"read {len(got)} of {count} records"
            print(f"{count:>7} records of {size} B: " + ", ".join(f"{x * 1000:.0f} ms" for x in times), flush=True)
    finally:
        await js.delete_key_value(BUCKET)
        await nc.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--counts", default="1000,5000,20000", help="comma list of record counts")
    ap.add_argument("--size", type=int, default=1500, help="bytes per record")
    args = ap.parse_args()
    counts = sorted(int(c) for c in args.counts.split(","))
    url = os.environ.get("NATS_URL")
    servers = None if url else EmbeddedServers().start()
    try:
        asyncio.run(bench(url or servers.nats_url, counts, args.size))  # type: ignore[union-attr]
    finally:
        if servers is not None:
            servers.stop()


if __name__ == "__main__":
    main()
