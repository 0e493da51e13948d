"""PNG plots of a replay, every policy on the same axes: allocated GPUs, queue length, wait CDFs, GPU heatmaps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from .engine import SimResult

DAY = 86400.0
SIZE_CLASSES: tuple[tuple[str, float, float], ...] = (
    ("1 GPU or less", 0.0, 1.0),
    ("2-4 GPUs", 2.0, 4.0),
    ("5-8 GPUs", 5.0, 8.0),
    ("more than 8 GPUs", 9.0, float("inf")),
)


def _thin(t: Sequence[float], y: Sequence[float], n: int = 4000) -> tuple[np.ndarray, np.ndarray]:
    ta, ya = np.asarray(t, dtype=float), np.asarray(y, dtype=float)
    if len(ta) > n:
        idx = np.linspace(0, len(ta) - 1, n).astype(int)
        ta, ya = ta[idx], ya[idx]
    return ta, ya


def _series(results: Mapping[str, SimResult], out: Path, attr: str, ylabel: str, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for name, res in results.items():
        t, y = _thin(res.series_t, getattr(res, attr))
        ax.step((t - res.start_s) / DAY, y, where="post", label=name, linewidth=1)
    if attr == "series_alloc":
        total = next(iter(results.values())).total_gpus
        ax.axhline(total, color="grey", linestyle=":", linewidth=1, label=f"capacity ({total})")
    ax.set_xlabel("days since the first submission")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def wait_cdf(results: Mapping[str, SimResult], out: Path) -> Path:
    fig, axes = plt.subplots(1, len(SIZE_CLASSES), figsize=(15, 4), sharey=True)
    for ax, (label, lo, hi) in zip(axes, SIZE_CLASSES, strict=True):
        for name, res in results.items():
            waits = sorted(
                r.wait_s / 3600 for r in res.records.values() if r.finish_s is not None and lo <= r.job.gpus <= hi
            )
            if waits:
                ys = np.arange(1, len(waits) + 1) / len(waits)
                ax.step(np.maximum(waits, 1e-3), ys, where="post", label=name, linewidth=1)
        ax.set_xscale("log")
        ax.set_title(label)
        ax.set_xlabel("wait (hours, log)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of jobs waiting at most this long")
    labelled = {lab: h for ax in axes for h, lab in zip(*ax.get_legend_handles_labels(), strict=True)}
    fig.suptitle("Wait-time CDF by job size")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    if labelled:
        fig.legend(list(labelled.values()), list(labelled), loc="lower center", ncol=len(labelled), fontsize=8)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def heatmaps(results: Mapping[str, SimResult], out: Path) -> Path:
    n = len(results)
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n + 1, 6), squeeze=False)
    im = None
    for ax, (name, res) in zip(axes[0], results.items(), strict=True):
        span = max(res.end_s - res.start_s, 1e-9)
        width = max((len(r) for r in res.gpu_busy), default=1)
        grid = np.full((len(res.gpu_busy), width), np.nan)
        for i, row in enumerate(res.gpu_busy):
            grid[i, : len(row)] = np.asarray(row) / span
        im = ax.imshow(grid, aspect="auto", interpolation="nearest", vmin=0, vmax=1, cmap="viridis")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("GPU index")
    axes[0][0].set_ylabel("node")
    if im is not None:
        fig.colorbar(im, ax=axes[0].tolist(), label="share of time allocated")
    fig.suptitle("Node x GPU allocation over the whole run")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write_plots(results: Mapping[str, SimResult], out_dir: Path | str) -> list[Path]:
    """Write the four PNGs into `out_dir` (created) and return their paths."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    return [
        _series(results, d / "gpus_allocated.png", "series_alloc", "GPUs allocated", "GPUs allocated over time"),
        _series(results, d / "queue_length.png", "series_pending", "pending jobs", "Queue length over time"),
        wait_cdf(results, d / "wait_cdf_by_size.png"),
        heatmaps(results, d / "gpu_heatmap.png"),
    ]
