#!/usr/bin/env python3
"""Prometheus configuration from the chart's monitoring objects, for a Prometheus that has no prometheus-operator:

  promconfig.py podmonitors [RENDERED.yaml] [--kubeconfig PATH]
                                              the chart's PodMonitors as kubernetes_sd scrape configs (what the
                                              operator would generate; run it against a cluster's Prometheus, or
                                              outside the cluster with --kubeconfig: the apiserver and credentials
                                              Prometheus discovers pods with)
  promconfig.py rules [RENDERED.yaml]         the PrometheusRule's groups as a plain rule file
  promconfig.py local [--target HOST:PORT] [--file-sd PATH] [--rules FILE]
                                              prometheus.yml scraping a local Ray, labelled as the PodMonitors
                                              label pods, so the chart's dashboards and rules work unchanged

RENDERED.yaml is `helm template ... --set monitoring.enabled=true` output (stdin when omitted). YAML goes to stdout.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any, Iterable

import yaml

# What `make monitor` and the live test label a local Ray with: the chart's dashboards filter on these.
LOCAL_LABELS = {"namespace": "local", "ray_io_cluster": "local", "ray_io_node_type": "head"}


def _sanitize(name: str) -> str:
    """A Kubernetes label name as Prometheus' kubernetes_sd meta label suffix."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _label(name: str) -> str:
    return f"__meta_kubernetes_pod_label_{_sanitize(name)}"


def _present(name: str) -> str:
    return f"__meta_kubernetes_pod_labelpresent_{_sanitize(name)}"


def _selector_relabelings(selector: dict[str, Any]) -> list[dict[str, Any]]:
    """A LabelSelector as keep/drop relabelings (the ones prometheus-operator generates)."""
    out: list[dict[str, Any]] = []
    for key, value in sorted((selector.get("matchLabels") or {}).items()):
        out.append({"action": "keep", "source_labels": [_label(key), _present(key)],
                    "regex": f"({re.escape(str(value))});true"})
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], [re.escape(str(v)) for v in expr.get("values") or []]
        if op == "In":
            out.append({"action": "keep", "source_labels": [_label(key), _present(key)],
                        "regex": f"({'|'.join(values)});true"})
        elif op == "NotIn":
            out.append({"action": "drop", "source_labels": [_label(key), _present(key)],
                        "regex": f"({'|'.join(values)});true"})
        elif op == "Exists":
            out.append({"action": "keep", "source_labels": [_present(key)], "regex": "true"})
        elif op == "DoesNotExist":
            out.append({"action": "drop", "source_labels": [_present(key)], "regex": "true"})
        else:
            raise ValueError(f"unknown matchExpressions operator {op!r} for key {key!r}")
    return out


def podmonitor_scrape_configs(podmonitor: dict[str, Any], kubeconfig: str | None = None) -> list[dict[str, Any]]:
    """One scrape config per podMetricsEndpoint of a PodMonitor (monitoring.coreos.com/v1). `kubeconfig`: discover
    through that kubeconfig's apiserver (a Prometheus outside the cluster) instead of the in-cluster service account."""
    meta, spec = podmonitor["metadata"], podmonitor["spec"]
    ns_sel = spec.get("namespaceSelector") or {}
    if ns_sel.get("any"):
        namespaces: list[str] = []
    else:
        namespaces = list(ns_sel.get("matchNames") or [meta.get("namespace", "default")])
    sd: dict[str, Any] = {"role": "pod"}
    if namespaces:
        sd["namespaces"] = {"names": namespaces}
    if kubeconfig:
        sd["kubeconfig_file"] = kubeconfig
    out = []
    for i, ep in enumerate(spec.get("podMetricsEndpoints") or []):
        # The operator skips finished pods unless the endpoint sets filterRunning: false.
        relabel = [] if ep.get("filterRunning") is False else [
            {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}]
        relabel += _selector_relabelings(spec.get("selector") or {})
        if "port" not in ep:
            raise ValueError(f"PodMonitor {meta['name']}: endpoint {i} names no port (only named ports are supported)")
        relabel.append({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                        "regex": re.escape(ep["port"])})
        relabel += [
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        ]
        for key in spec.get("podTargetLabels") or []:
            relabel.append({"source_labels": [_label(key)], "regex": "(.+)", "target_label": _sanitize(key),
                            "replacement": "${1}"})
        job = f"podMonitor/{namespaces[0] if len(namespaces) == 1 else '-'}/{meta['name']}/{i}"
        relabel.append({"target_label": "job", "replacement": job})
        if spec.get("jobLabel"):
            relabel.append({"source_labels": [_label(spec["jobLabel"])], "regex": "(.+)", "target_label": "job",
                            "replacement": "${1}"})
        relabel.append({"target_label": "endpoint", "replacement": ep["port"]})
        for r in ep.get("relabelings") or []:
            relabel.append({_snake(k): v for k, v in r.items()})
        cfg: dict[str, Any] = {"job_name": job, "honor_labels": bool(ep.get("honorLabels", False)),
                               "kubernetes_sd_configs": [sd], "metrics_path": ep.get("path", "/metrics"),
                               "scheme": ep.get("scheme", "http"), "relabel_configs": relabel}
        if ep.get("interval"):
            cfg["scrape_interval"] = ep["interval"]
        if ep.get("scrapeTimeout"):
            cfg["scrape_timeout"] = ep["scrapeTimeout"]
        out.append(cfg)
    return out


def _snake(key: str) -> str:
    """prometheus-operator's camelCase relabel keys (sourceLabels) -> Prometheus' snake_case (source_labels)."""
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def scrape_configs(docs: Iterable[dict[str, Any]], kubeconfig: str | None = None) -> list[dict[str, Any]]:
    return [c for d in docs if d and d.get("kind") == "PodMonitor" for c in podmonitor_scrape_configs(d, kubeconfig)]


def kubeconfig_path(path: str) -> str:
    """An absolute path (Prometheus reads a relative kubeconfig_file relative to its config file) to a file that
    exists; the kubeconfig's content is Prometheus' to judge at load."""
    if not os.path.isfile(path):
        raise ValueError(f"--kubeconfig {path}: no such file")
    return os.path.abspath(path)


def rule_groups(docs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    groups = [g for d in docs if d and d.get("kind") == "PrometheusRule" for g in d["spec"]["groups"]]
    return {"groups": groups}


def local_config(targets: list[str], rule_files: list[str], interval: str = "15s",
                 labels: dict[str, str] | None = None, file_sd: list[str] | None = None) -> dict[str, Any]:
    """prometheus.yml for a Ray on this machine, labelled like the chart's pods: static targets (metrics ports),
    and/or the service discovery file Ray keeps up to date (<ray temp dir>/prom_metrics_service_discovery.json:
    every node's metrics port plus the head's autoscaler and dashboard metrics ports)."""
    labels = dict(labels or LOCAL_LABELS)
    job: dict[str, Any] = {"job_name": "ray"}
    if targets:
        job["static_configs"] = [{"targets": list(targets), "labels": labels}]
    if file_sd:
        job["file_sd_configs"] = [{"files": list(file_sd)}]
        job["relabel_configs"] = [{"target_label": k, "replacement": v} for k, v in labels.items()]
    if not targets and not file_sd:
        raise ValueError("no scrape target: give --target HOST:PORT and/or --file-sd PATH")
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": list(rule_files),
        "scrape_configs": [job],
    }


def load(path: str | None) -> list[dict[str, Any]]:
    text = open(path).read() if path and path != "-" else sys.stdin.read()
    return [d for d in yaml.safe_load_all(text) if d]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    parsers = {name: sub.add_parser(name) for name in ("podmonitors", "rules")}
    for sp in parsers.values():
        sp.add_argument("rendered", nargs="?", help="helm template output (default: stdin)")
    parsers["podmonitors"].add_argument("--kubeconfig", help="kubeconfig for kubernetes_sd (Prometheus outside the "
                                        "cluster); default: the in-cluster service account")
    loc = sub.add_parser("local")
    loc.add_argument("--target", action="append", default=[], help="HOST:PORT of a Ray metrics port")
    loc.add_argument("--file-sd", action="append", default=[], help="Ray's prom_metrics_service_discovery.json")
    loc.add_argument("--rules", action="append", default=[], help="rule file to load")
    loc.add_argument("--interval", default="15s")
    args = p.parse_args(argv)
    try:
        if args.cmd == "podmonitors":
            kubeconfig = kubeconfig_path(args.kubeconfig) if args.kubeconfig else None
            out: Any = {"scrape_configs": scrape_configs(load(args.rendered), kubeconfig)}
            if not out["scrape_configs"]:
                raise ValueError("no PodMonitor in the input (render the chart with monitoring.enabled=true)")
        elif args.cmd == "rules":
            out = rule_groups(load(args.rendered))
            if not out["groups"]:
                raise ValueError("no PrometheusRule in the input (render with monitoring.enabled=true)")
        else:
            out = local_config(args.target, args.rules, args.interval, file_sd=args.file_sd)
    except (OSError, ValueError, KeyError, yaml.YAMLError) as e:
        print(f"promconfig: {e}", file=sys.stderr)
        return 2
    yaml.safe_dump(out, sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
