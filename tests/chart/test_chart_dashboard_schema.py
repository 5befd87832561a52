"""Our Grafana dashboards type-check against Grafana's published dashboard schema (npm @grafana/schema, Apache-2.0)
with the TypeScript compiler: no Grafana server (AGPL) involved. Each rendered dashboard becomes
`const dashboard: Dashboard = <json>;`, so tsc checks every field's name and type (excess-property checks included).

Ray's generated dashboards (ray-*.json, schemaVersion 27, legacy `graph` panels with string datasources) are not
checked: they predate this schema and Grafana migrates them when it loads them.
"""

import json
import os
import shutil
import subprocess

import pytest

from chartkit import versions

pytestmark = pytest.mark.chart
TSCONFIG = {"compilerOptions": {"strict": True, "noEmit": True, "module": "esnext", "moduleResolution": "bundler",
                                "target": "es2022", "skipLibCheck": True, "types": []}, "include": ["*.ts"]}


@pytest.fixture(scope="session")
def node_modules() -> str:
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("node/npm not installed: Grafana dashboard schema check skipped")
    v = versions()
    cache = os.path.join(os.environ.get("RLP_CACHE") or os.path.expanduser("~/.cache/rl-platform"),
                         f"grafana-schema-{v['GRAFANA_SCHEMA_VERSION']}-ts-{v['TYPESCRIPT_VERSION']}")
    if not os.path.isdir(os.path.join(cache, "node_modules", "typescript")):
        tmp = f"{cache}.tmp.{os.getpid()}"
        os.makedirs(tmp, exist_ok=True)
        with open(os.path.join(tmp, "package.json"), "w") as f:
            f.write('{"private": true}\n')
        proc = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--ignore-scripts", "--prefix", tmp,
                               f"@grafana/schema@{v['GRAFANA_SCHEMA_VERSION']}", f"typescript@{v['TYPESCRIPT_VERSION']}"],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        if not os.path.isdir(cache):
            os.rename(tmp, cache)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return os.path.join(cache, "node_modules")


def _tsc(node_modules: str, dashboards: dict[str, dict], tmp_path) -> subprocess.CompletedProcess:
    os.symlink(node_modules, tmp_path / "node_modules")
    (tmp_path / "tsconfig.json").write_text(json.dumps(TSCONFIG))
    for name, dash in dashboards.items():
        (tmp_path / f"{name}.ts").write_text(
            "import type { Dashboard } from '@grafana/schema';\n"
            f"const dashboard: Dashboard = {json.dumps(dash, indent=1)};\nexport default dashboard;\n")
    return subprocess.run(["node", os.path.join(node_modules, "typescript", "bin", "tsc"), "-p", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)


def _ours(tools) -> dict[str, dict]:
    out = {}
    for d in tools.render(sets={"monitoring.enabled": True}):
        if d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get("grafana_dashboard") == "1":
            ((name, body),) = d["data"].items()
            if name.startswith("rl-platform-"):
                out[name.removesuffix(".json")] = json.loads(body)
    return out


def test_our_dashboards_type_check_against_grafana_schema(tools, node_modules, tmp_path):
    dashboards = _ours(tools)
    assert set(dashboards) == {"rl-platform-training", "rl-platform-serving"}
    proc = _tsc(node_modules, dashboards, tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_the_schema_check_rejects_a_wrong_field(tools, node_modules, tmp_path):
    dash = _ours(tools)["rl-platform-serving"]
    dash["panels"][0]["gridPos"]["w"] = "12"  # a string where the schema wants a number
    dash["panels"][1]["titel"] = "typo"  # a field the schema does not have
    proc = _tsc(node_modules, {"broken": dash}, tmp_path)
    assert proc.returncode != 0
    assert "gridPos" in proc.stdout or "'w'" in proc.stdout or "TS2322" in proc.stdout, proc.stdout
    assert "titel" in proc.stdout, proc.stdout
