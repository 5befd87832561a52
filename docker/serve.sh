#!/bin/sh
# rlp-serve: the policy server in a container (docker run / compose): `python -m serving` (serving/README.md)
# on an embedded Ray, listening on all interfaces so a published port reaches it, Ray metrics on :8080.
#   docker run ... rl-platform:0.1.0-cpu rlp-serve --checkpoint /ckpt [--policy NAME=DIR ...] [--num-cpus N]
# Any `python -m serving` flag may follow and overrides these defaults. On Kubernetes the RayService (KubeRay)
# starts Ray and deploys serveConfigV2 instead; this script is not used there.
exec python -m serving --host "${RLP_SERVE_HOST:-0.0.0.0}" --port "${RLP_SERVE_PORT:-8000}" \
  --metrics-port "${RAY_METRICS_EXPORT_PORT:-8080}" "$@"
