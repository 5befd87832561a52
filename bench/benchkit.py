"""Shared by the bench/ scripts: interleaved A/B rounds, medians, load recording, results JSON and PNG plots.

The machines these run on are shared and noisy: every script alternates its variants (A, B, A, B, ...) inside one
invocation and reports medians and ratios; absolute seconds mean little, the ratio of neighbours does. Each result
records the load average before and after so a reader can judge the noise.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
NOTE = ("variants were run interleaved (A, B, A, B, ...) in one invocation on a shared machine; absolute seconds "
        "depend on its load (loadavg_before/after), compare the ratios")


def timed_json_run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 900) -> dict[str, Any]:
    """Run `cmd` (a trainer run or a probe whose last stdout line is one JSON object) in the repo; returns that
    object plus `process_wall_s`. A non-zero exit raises with the end of stderr."""
    import subprocess
    import time

    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process_wall_s"] = round(wall, 2)
    return out


def machine(load_before: tuple[float, float, float]) -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_before": list(load_before),
            "loadavg_after": list(os.getloadavg()), "note": NOTE}


def interleave(variants: dict[str, Callable[[], dict]], rounds: int, show: Callable[[str, dict], str]) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for i in range(rounds):
        for name, fn in variants.items():
            r = fn()
            runs[name].append(r)
            print(f"round {i + 1} {name:28s} {show(name, r)}", flush=True)
    return runs


def median(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(vals), 4) if vals else None


def write(name: str, report: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    report.setdefault("command", f"bench/{Path(sys.argv[0]).name} " + " ".join(sys.argv[1:]))
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"-> {out}", flush=True)
    return out


def bar_png(name: str, title: str, labels: list[str], values: list[float], ylabel: str,
            peer: float | None = None, peer_label: str = "", out: Path | None = None) -> Path:
    """A bar chart, written to `out` (default: bench/results/<name>.png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(labels) + 2), 3.6), dpi=100)
    ax.bar(range(len(labels)), values, color="tab:blue")
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    if peer is not None:
        ax.axhline(peer, color="tab:red", linestyle="--", linewidth=1, label=peer_label)
        ax.legend(fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    out = Path(out) if out else RESULTS / f"{name}.png"
    fig.savefig(out)
    plt.close(fig)
    return out
