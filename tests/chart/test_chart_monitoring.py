"""PrometheusRule passes `promtool check rules` and behaves as its `promtool test rules` cases say; dashboards are
valid JSON that use only metrics from monitoring.metrics."""

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

from chartkit import CHART

pytestmark = pytest.mark.chart
CASES = __import__("pathlib").Path(__file__).parent / "promtool" / "rules_test.yaml"


def _rules(tools, sets=None):
    docs = tools.render(sets={"monitoring.enabled": True, **(sets or {})})
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    return {"groups": rule["spec"]["groups"]}


def _write(tmp_path, groups):
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(groups, sort_keys=False))
    return path


def test_promtool_check_rules(tools, tmp_path):
    path = _write(tmp_path, _rules(tools))
    proc = subprocess.run([tools.promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"SUCCESS: (\d+) rules found", proc.stdout + proc.stderr)


def test_promtool_check_rules_rejects_a_broken_expression(tools, tmp_path):
    groups = _rules(tools)
    rule = groups["groups"][0]["rules"][0]
    rule["expr"] += " by ("
    proc = subprocess.run([tools.promtool(), "check", "rules", str(_write(tmp_path, groups))],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    # The message names the rule and says what is wrong with its expression.
    name = rule.get("record") or rule["alert"]
    assert f'"{name}": could not parse expression' in out and "unexpected <by>" in out, out


def test_promtool_rule_unit_tests(tools, tmp_path):
    _write(tmp_path, _rules(tools))
    shutil.copy(CASES, tmp_path / "rules_test.yaml")
    proc = subprocess.run([tools.promtool(), "test", "rules", "rules_test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_every_alert_has_a_firing_and_a_quiet_promtool_case(tools):
    """Each alert the chart ships has a promtool case where it fires and one where it must not (`exp_alerts: []`):
    a rule that always fires, or never does, fails one of the two. Cases naming no shipped alert are stale."""
    alerts = {r["alert"] for g in _rules(tools)["groups"] for r in g["rules"] if "alert" in r}
    fires, quiet = set(), set()
    for case in yaml.safe_load(CASES.read_text())["tests"]:
        for t in case.get("alert_rule_test", []):
            (fires if t.get("exp_alerts") else quiet).add(t["alertname"])
    assert len(alerts) >= 15, alerts
    assert not alerts - fires, f"alerts with no promtool case where they fire: {sorted(alerts - fires)}"
    assert not alerts - quiet, f"alerts with no promtool case where they must not fire: {sorted(alerts - quiet)}"
    unknown = (fires | quiet) - alerts
    assert not unknown, f"promtool cases for alerts the chart does not ship: {sorted(unknown)}"


@pytest.mark.parametrize("sets,alert", [
    # At a 20% threshold the 10% error ratio case no longer fires.
    ({"monitoring.rules.serveErrorRatio": 0.2}, "RayServeHighErrorRate"),
    # At 50 ms the ~99 ms cluster fires too.
    ({"monitoring.rules.serveLatencyP99Ms": 50}, "RayServeHighLatency"),
    # At 10 episodes the candidate with 15 (far worse) episodes in the window is compared and fires.
    ({"monitoring.rules.canaryMinEpisodes": 10}, "RLPolicyCanaryWorseReturn"),
    # At z 0.1 the noisy candidate's 2-point shortfall (z 0.30) counts; at a margin of 25 the 20-point one does not.
    ({"monitoring.rules.canaryReturnZ": 0.1}, "RLPolicyCanaryWorseReturn"),
    ({"monitoring.rules.canaryReturnMargin": 25}, "RLPolicyCanaryWorseReturn"),
    ({"monitoring.rules.canaryErrorRatio": 0.3}, "RLPolicyCanaryErrorRatioHigh"),
    ({"monitoring.rules.canaryLatencyP99Ms": 300}, "RLPolicyCanaryLatencyHigh"),
], ids=lambda v: next(iter(v)).rsplit(".", 1)[-1] if isinstance(v, dict) else v)
def test_promtool_unit_tests_fail_when_a_threshold_changes(tools, tmp_path, sets, alert):
    """The cases bite: with another threshold the cases of that alert no longer hold."""
    _write(tmp_path, _rules(tools, sets))
    shutil.copy(CASES, tmp_path / "rules_test.yaml")
    proc = subprocess.run([tools.promtool(), "test", "rules", "rules_test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode != 0
    failed = set(re.findall(r"alertname: (\w+)", proc.stdout + proc.stderr))
    assert failed == {alert}, proc.stdout + proc.stderr


def test_rules_and_dashboards_use_the_metric_names_from_values(tools):
    metrics = yaml.safe_load((CHART / "values.yaml").read_text())["monitoring"]["metrics"]
    renamed = {k: f"renamed_{k}" for k in metrics}
    docs = tools.render(sets={"monitoring.enabled": True, "monitoring.metrics": renamed})
    # Ray's own dashboards (ray-*.json) name Ray's metrics themselves; ours and the rules take them from values.
    ours = [d for d in docs if d["kind"] == "PrometheusRule"
            or (d["kind"] == "ConfigMap" and any(k.startswith("rl-platform-") for k in d.get("data", {})))]
    assert len(ours) == 3
    text = yaml.safe_dump(ours)
    for original in metrics.values():
        assert original not in text, f"{original} is hard-coded instead of taken from monitoring.metrics"
    for new in renamed.values():
        assert new in text, f"{new} (monitoring.metrics) is used by no rule or dashboard"


def test_dashboards_are_valid_grafana_json(tools):
    docs = tools.render(sets={"monitoring.enabled": True})
    maps = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    uids = set()
    for cm in maps:
        ((name, body),) = cm["data"].items()
        dash = json.loads(body)
        uids.add(dash["uid"])
        if dash["uid"].startswith("rl-platform-"):
            queried = [p for p in dash["panels"] if p["type"] != "row"]
            assert queried and all(p["targets"] for p in queried)
            assert all(t["expr"] and "@@" not in t["expr"] for p in queried for t in p["targets"])
            ids = [p["id"] for p in dash["panels"]]
            assert len(ids) == len(set(ids)), name
    # Ours, plus Ray's own under the uids the Ray dashboard embeds panels from.
    assert uids == {"rl-platform-training", "rl-platform-serving", "rayDefaultDashboard", "rayServeDashboard",
                    "rayServeDeploymentDashboard"}
    assert all(len(yaml.safe_dump(cm)) < 512 * 1024 for cm in maps)


def test_training_metric_names_in_values_are_the_ones_the_trainer_exports():
    """values.yaml names trainer/metrics.py's series as Ray exports them (`ray_` prefix, `_total` on counters)."""
    from trainer.metrics import NAMES

    metrics = yaml.safe_load((CHART / "values.yaml").read_text())["monitoring"]["metrics"]
    exported = {f"ray_{n}_total" if k in ("env_steps", "iterations") else f"ray_{n}" for k, n in NAMES.items()}
    train = {v for k, v in metrics.items() if k.startswith("train")}
    assert train and train <= exported, train - exported


def test_podmonitors_become_a_valid_kubernetes_sd_scrape_config(tools, tmp_path):
    """hack/promconfig.py: the PodMonitors as plain Prometheus scrape configs (no operator); promtool accepts them."""
    import sys

    sys.path.insert(0, str(CHART.parents[1] / "hack"))
    import promconfig

    docs = tools.render(sets={"monitoring.enabled": True})
    configs = promconfig.scrape_configs(docs)
    assert len(configs) == 3
    head = next(c for c in configs if c["job_name"].endswith("-head/0"))
    assert head["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["rl"]}}]
    keeps = {tuple(r["source_labels"]): r["regex"] for r in head["relabel_configs"] if r.get("action") == "keep"}
    assert keeps[("__meta_kubernetes_pod_label_ray_io_node_type", "__meta_kubernetes_pod_labelpresent_ray_io_node_type")] == "(head);true"
    assert keeps[("__meta_kubernetes_pod_label_rl_platform_io_workload", "__meta_kubernetes_pod_labelpresent_rl_platform_io_workload")] == "(cluster|job);true"
    assert keeps[("__meta_kubernetes_pod_container_port_name",)] == "metrics"
    # As the operator (filterRunning defaults to true): finished pods are not scraped.
    assert head["relabel_configs"][0] == {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
                                          "regex": "(Failed|Succeeded)"}
    assert {"target_label": "ray_io_cluster", "source_labels": ["__meta_kubernetes_pod_label_ray_io_cluster"],
            "regex": "(.+)", "replacement": "${1}"} in head["relabel_configs"]
    # Debian's Prometheus build leaves out kubernetes_sd (its client-go dependency): promtool checks the relabelings
    # with a file_sd stand-in; a cluster's Prometheus (upstream build) takes the kubernetes_sd configs as they are.
    checkable = [{**{k: v for k, v in c.items() if k != "kubernetes_sd_configs"},
                  "file_sd_configs": [{"files": [str(tmp_path / "pods.json")]}]} for c in configs]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump({"scrape_configs": checkable}, sort_keys=False))
    proc = subprocess.run([tools.promtool(), "check", "config", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The CLI says what is wrong in one line when the input has no PodMonitor.
    cli = subprocess.run([sys.executable, str(CHART.parents[1] / "hack" / "promconfig.py"), "podmonitors"],
                         input="kind: ConfigMap\n", capture_output=True, text=True)
    assert cli.returncode == 2 and cli.stderr.count("\n") == 1 and "no PodMonitor" in cli.stderr
    # Outside the cluster: --kubeconfig names the apiserver and credentials, as an absolute path (Prometheus reads a
    # relative one relative to its config file); a missing file is refused in one line.
    (tmp_path / "kc").write_text("{}")
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(docs))
    cli = subprocess.run([sys.executable, str(CHART.parents[1] / "hack" / "promconfig.py"), "podmonitors",
                          str(rendered), "--kubeconfig", "kc"], capture_output=True, text=True, cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    sds = [sd for c in yaml.safe_load(cli.stdout)["scrape_configs"] for sd in c["kubernetes_sd_configs"]]
    assert len(sds) == 3 and all(os.path.isabs(sd["kubeconfig_file"]) for sd in sds)
    assert {os.path.realpath(sd["kubeconfig_file"]) for sd in sds} == {os.path.realpath(tmp_path / "kc")}
    cli = subprocess.run([sys.executable, str(CHART.parents[1] / "hack" / "promconfig.py"), "podmonitors",
                          str(rendered), "--kubeconfig", str(tmp_path / "absent")], capture_output=True, text=True)
    assert cli.returncode == 2 and cli.stderr.count("\n") == 1 and "absent: no such file" in cli.stderr
