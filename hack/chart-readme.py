#!/usr/bin/env python3
"""Render charts/rl-platform/README.md from README.md.gotmpl and the `# --` comments of values.yaml.

A small stand-in for helm-docs (not on any registry reachable here) that understands the same template markers:
{{ template "chart.valuesTable" . }}, {{ template "chart.version" . }}, {{ template "chart.appVersion" . }}.
A `# -- text` comment (continued by following `# text` lines) documents the next key; its default is the key's
value in values.yaml.

  hack/chart-readme.py [CHART_DIR] [--check]     --check: exit 1 if README.md is not up to date
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-\"]+):(?:\s|$)")


def documented_keys(values_text: str) -> list[tuple[str, str]]:
    """(dotted.key, description) in file order."""
    out: list[tuple[str, str]] = []
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    for line in values_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        if pending is not None and stripped.startswith("#"):
            pending.append(stripped[1:].strip())
            continue
        m = KEY.match(line)
        if not m or stripped.startswith("- "):
            if not stripped:
                continue
            if stripped.startswith("#"):
                pending = None
            continue
        indent, key = len(m.group("indent")), m.group("key").strip('"')
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        if pending is not None:
            out.append((".".join(k for _, k in stack), " ".join(pending)))
            pending = None
    return out


def lookup(values: dict, dotted: list[str]):
    node = values
    for k in dotted:
        node = node[k]
    return node


def type_of(v) -> str:
    return {bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "object"}.get(type(v), "")


def values_table(chart: Path) -> str:
    text = (chart / "values.yaml").read_text()
    values = yaml.safe_load(text)
    rows = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    for dotted, desc in documented_keys(text):
        # Keys may contain dots only as separators here; group names with dashes are fine.
        v = lookup(values, dotted.split("."))
        default = json.dumps(v, separators=(",", ":"))
        if len(default) > 80:
            default = "see values.yaml"
        cell = lambda s: s.replace("|", "\\|")  # noqa: E731
        rows.append(f"| `{dotted}` | {type_of(v)} | `{cell(default)}` | {cell(desc)} |")
    return "\n".join(rows)


def render(chart: Path) -> str:
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    out = (chart / "README.md.gotmpl").read_text()
    out = out.replace('{{ template "chart.valuesTable" . }}', values_table(chart))
    out = out.replace('{{ template "chart.version" . }}', str(meta["version"]))
    out = out.replace('{{ template "chart.appVersion" . }}', str(meta["appVersion"]))
    out = out.replace('{{ template "chart.kuberayVersion" . }}', meta["annotations"]["rl-platform.io/kuberay-version"])
    out = out.replace('{{ template "chart.kuberayTargetVersion" . }}',
                      meta["annotations"]["rl-platform.io/kuberay-target-version"])
    return out


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    chart = Path(args[0]) if args else Path(__file__).resolve().parents[1] / "charts" / "rl-platform"
    text = render(chart)
    readme = chart / "README.md"
    if "--check" in argv:
        if not readme.exists() or readme.read_text() != text:
            print(f"{readme} is out of date: run `make manifests` (hack/chart-readme.py)", file=sys.stderr)
            return 1
        return 0
    readme.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
