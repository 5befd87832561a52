#!/bin/sh
# rlp-serve: the policy server in a container (docker run / compose): `python -m serving` (serving/README.md)
# on an embedded Ray, listening on all interfaces so a published port reaches it, Ray metrics on :8080.
#   docker run ... "$(hack/images.sh tag cpu)" rlp-serve --checkpoint /ckpt [--policy NAME=DIR ...] [--num-cpus N]
# Any `python -m serving` flag may follow and overrides these defaults. On Kubernetes the RayService (KubeRay)
# starts Ray and deploys serveConfigV2 instead; this script is not used there.
# The container's network namespace is the fence: Ray listens on the container's address (token auth stays on) so the
# published metrics port reaches its exporter; embedded Ray outside a container listens on 127.0.0.1 only.
export RLP_RAY_LOOPBACK="${RLP_RAY_LOOPBACK:-0}"
exec python -m serving --host "${RLP_SERVE_HOST:-0.0.0.0}" --port "${RLP_SERVE_PORT:-8000}" \
  --metrics-port "${RAY_METRICS_EXPORT_PORT:-8080}" "$@"
