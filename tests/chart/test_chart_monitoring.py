"""PrometheusRule passes `promtool check rules` and behaves as its `promtool test rules` cases say; dashboards are
valid JSON that use only metrics from monitoring.metrics."""

import json
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
    groups["groups"][0]["rules"][0]["expr"] += " by ("
    proc = subprocess.run([tools.promtool(), "check", "rules", str(_write(tmp_path, groups))],
                          capture_output=True, text=True)
    assert proc.returncode != 0


def test_promtool_rule_unit_tests(tools, tmp_path):
    _write(tmp_path, _rules(tools))
    shutil.copy(CASES, tmp_path / "rules_test.yaml")
    proc = subprocess.run([tools.promtool(), "test", "rules", "rules_test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_promtool_unit_tests_fail_when_a_threshold_changes(tools, tmp_path):
    """The cases bite: at a 20% threshold the 10% error ratio case no longer fires."""
    _write(tmp_path, _rules(tools, {"monitoring.rules.serveErrorRatio": 0.2}))
    shutil.copy(CASES, tmp_path / "rules_test.yaml")
    proc = subprocess.run([tools.promtool(), "test", "rules", "rules_test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert "RayServeHighErrorRate" in proc.stdout + proc.stderr


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
            assert dash["panels"] and all(p["targets"] for p in dash["panels"])
            assert all(t["expr"] and "@@" not in t["expr"] for p in dash["panels"] for t in p["targets"])
            ids = [p["id"] for p in dash["panels"]]
            assert len(ids) == len(set(ids)), name
    # Ours, plus Ray's own under the uids the Ray dashboard embeds panels from.
    assert uids == {"rl-platform-training", "rl-platform-serving", "rayDefaultDashboard", "rayServeDashboard",
                    "rayServeDeploymentDashboard"}
    assert all(len(yaml.safe_dump(cm)) < 512 * 1024 for cm in maps)
