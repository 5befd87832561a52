#!/usr/bin/env bash
# `make monitor`: Prometheus on 127.0.0.1:${PROMETHEUS_PORT} scraping the local Ray (every node Ray lists in
# <RAY_TEMP_DIR>/prom_metrics_service_discovery.json), with the chart's alerting/recording rules loaded, and the
# chart's Grafana dashboards written as standalone JSON for import. Runs in the foreground; Ctrl-C stops it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PORT="${PROMETHEUS_PORT:-9090}"
RAY_TMP="${RAY_TEMP_DIR:-/tmp/ray}"
WORK="${MONITOR_DIR:-${ROOT}/outputs/monitor}"
PY="${ROOT}/.venv/bin/python"; [[ -x "${PY}" ]] || PY=python3

"${ROOT}/hack/tools.sh" prometheus
"${ROOT}/hack/tools.sh" helm
eval "$("${ROOT}/hack/tools.sh" env | sed 's/^/export /')"
[[ -x "${PROMETHEUS:-}" ]] || { echo "monitor: no Prometheus server (hack/tools.sh prometheus needs apt's Debian prometheus package)" >&2; exit 2; }

mkdir -p "${WORK}/dashboards"
"${HELM}" template rl-platform "${ROOT}/charts/rl-platform" --namespace local --kube-version "${KUBE_VERSION}" \
  --set monitoring.enabled=true > "${WORK}/rendered.yaml"
"${PY}" "${ROOT}/hack/promconfig.py" rules "${WORK}/rendered.yaml" > "${WORK}/rules.yaml"
"${PY}" "${ROOT}/hack/promconfig.py" local --file-sd "${RAY_TMP}/prom_metrics_service_discovery.json" \
  --rules "${WORK}/rules.yaml" > "${WORK}/prometheus.yml"
# Standalone dashboards (metric names filled in from values.yaml), importable into any Grafana.
"${PY}" - "${WORK}/rendered.yaml" "${WORK}/dashboards" <<'PYEOF'
import json, pathlib, sys, yaml
out = pathlib.Path(sys.argv[2])
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get("grafana_dashboard") == "1":
        for name, body in d["data"].items():
            (out / name).write_text(json.dumps(json.loads(body), indent=1) + "\n")
PYEOF

cat <<MSG
[monitor] Prometheus      http://127.0.0.1:${PORT}   (alerts: http://127.0.0.1:${PORT}/alerts)
[monitor] scraping        every node in ${RAY_TMP}/prom_metrics_service_discovery.json (written by \`ray start --head\`)
[monitor] Ray dashboard   start Ray with the Prometheus URL so its Metrics view works:
            RAY_PROMETHEUS_HOST=http://127.0.0.1:${PORT} ray start --head --metrics-export-port=8080
          then open http://127.0.0.1:8265/#/metrics ; \`make train ARGS="resources.address=auto"\` trains on it
[monitor] dashboards      ${WORK}/dashboards/*.json (import into Grafana; datasource: this Prometheus)
MSG
[[ -f "${RAY_TMP}/prom_metrics_service_discovery.json" ]] || \
  echo "[monitor] no Ray running yet (${RAY_TMP}/prom_metrics_service_discovery.json missing): start one as above"
exec "${PROMETHEUS}" --config.file="${WORK}/prometheus.yml" --storage.tsdb.path="${WORK}/data" \
  --web.listen-address="127.0.0.1:${PORT}" --web.enable-lifecycle --log.level=warn
