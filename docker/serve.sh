#!/bin/bash
# rlp-serve: run the rl-platform Serve application in a single container (docker run / docker compose).
# Starts a Ray head (metrics on :8080 for Prometheus), then `serve run` the config and stays in the foreground.
# On Kubernetes the RayService (KubeRay) starts Ray and deploys serveConfigV2 instead; this script is not used.
#
# Usage: rlp-serve [CONFIG.yaml] [extra `serve run` args]
#   CONFIG defaults to $RLP_SERVE_CONFIG, else serving/serve_config.yaml from the installed package.
# Env: RAY_METRICS_EXPORT_PORT (8080), RLP_RAY_START_ARGS (extra `ray start` args, e.g. --num-cpus=2).
set -euo pipefail

config="${1:-${RLP_SERVE_CONFIG:-}}"
[[ $# -gt 0 ]] && shift
if [[ -z "${config}" ]]; then
  config="$(python -c 'import os, serving; print(os.path.join(os.path.dirname(serving.__file__), "serve_config.yaml"))')"
fi
[[ -r "${config}" ]] || { echo "rlp-serve: no serve config at ${config}" >&2; exit 2; }

stop() {
  ray stop --force >/dev/null 2>&1 || true
}
trap 'stop; exit 0' TERM INT

# shellcheck disable=SC2086
ray start --head --disable-usage-stats --include-dashboard=false \
  --metrics-export-port="${RAY_METRICS_EXPORT_PORT:-8080}" ${RLP_RAY_START_ARGS:-}
serve run --address auto "${config}" "$@" &
wait $!
rc=$?
stop
exit "${rc}"
