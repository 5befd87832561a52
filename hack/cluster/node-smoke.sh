#!/usr/bin/env bash
# Smoke test of the Level B real node (hack/cluster/node.sh up must have run): real pods on this machine.
#   1. a debian pod and a pause pod Running
#   2. a pod from the project CPU image runs `ray.init()` and prints the cluster resources
#   3. a Service ClusterIP (backed by a real pod) answers from the host and from another pod; the `kubernetes`
#      Service answers from a pod
#   4. `kubernetes.default.svc.cluster.local` and a Service name resolve in pods (CoreDNS through ${DNS_SVC_IP})
#   5. kubectl exec/logs work (apiserver -> kubelet on ${NODE_IP}:10250 with the kubelet's serving certificate)
# Prints seconds per check; exit 1 on the first failure (with the pod's description). Cleans its namespace up.
#
# Usage: hack/cluster/node-smoke.sh            (RLP_CLUSTER_DIR etc. as for hack/cluster.sh)
#   RLP_SMOKE_KEEP=1  keep the namespace for inspection
set -euo pipefail
# shellcheck source=hack/cluster/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

K8S_BIN="${K8S_BIN:-$("${RLP_ROOT}/hack/tools.sh" env | sed -n 's/^K8S_BIN=//p')}"
PAUSE_IMAGE="${PAUSE_IMAGE:-$("${RLP_ROOT}/hack/tools.sh" env | sed -n 's/^PAUSE_IMAGE=//p')}"
IMAGE_CPU="${IMAGE_CPU:-$(sed -n 's/^IMAGE_CPU[[:space:]]*:=[[:space:]]*\([^[:space:]]*\).*/\1/p' "${RLP_ROOT}/mk/versions.mk")}"
# The "debian" pod: the project CPU image is Debian bookworm based and always imported by node.sh up.
DEBIAN_IMAGE="${RLP_SMOKE_DEBIAN_IMAGE:-${IMAGE_CPU}}"
NS="rlp-node-smoke"
kc() { "${K8S_BIN}/kubectl" --kubeconfig "${KUBECONFIG_ADMIN}" "$@"; }
log() { printf '[smoke] %s\n' "$*" >&2; }
FIGS=()
fail() {
  printf 'node-smoke: %s\n' "$1" >&2
  [[ -n "${2:-}" ]] && kc -n "${NS}" describe pod "$2" 2>/dev/null | tail -n 25 >&2
  [[ -n "${2:-}" ]] && kc -n "${NS}" logs "$2" --tail 20 2>/dev/null >&2
  exit 1
}
cleanup() { [[ "${RLP_SMOKE_KEEP:-0}" == 1 ]] || kc delete namespace "${NS}" --ignore-not-found --wait=false >/dev/null 2>&1 || true; }
trap cleanup EXIT

pod() { # pod NAME IMAGE RESTART ARGS...: a restricted-PSS pod pinned to the real node, imagePullPolicy Never
  local name="$1" image="$2" restart="$3" args="" a; shift 3
  for a in "$@"; do args+="$(printf '%s' "${a}" | "$(command -v /usr/bin/python3 || command -v python3)" -c 'import json,sys; print(json.dumps(sys.stdin.read()))'), "; done
  kc -n "${NS}" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: ${name}, labels: {app: ${name}}}
spec:
  nodeSelector: {rl-platform.io/node: real}
  restartPolicy: ${restart}
  terminationGracePeriodSeconds: 1
  automountServiceAccountToken: false
  securityContext: {runAsNonRoot: true, runAsUser: 65534, runAsGroup: 65534, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: main
    image: ${image}
    imagePullPolicy: Never
    ${args:+command: [${args%, }]}
    securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
    env: [{name: HOME, value: /tmp}]
    resources: {requests: {cpu: 50m, memory: 64Mi}}
EOF
}
wait_phase() { # wait_phase POD PHASE SECONDS
  local deadline=$((SECONDS + $3)) ph
  while :; do
    ph="$(kc -n "${NS}" get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null || true)"
    [[ "${ph}" == "$2" ]] && return 0
    [[ "${ph}" == Failed ]] && fail "pod $1 Failed (wanted $2)" "$1"
    ((SECONDS < deadline)) || fail "pod $1 is ${ph:-absent} after $3s, not $2" "$1"
    sleep 0.5
  done
}
timed() { local t=${SECONDS} what="$1"; shift; "$@"; FIGS+=("${what} $((SECONDS - t))s"); log "ok: ${what} ($((SECONDS - t))s)"; }

kc get --raw /readyz >/dev/null || fail "the apiserver ${APISERVER_URL} does not answer"
kc delete namespace "${NS}" --ignore-not-found --wait=true --timeout=60s >/dev/null
kc create namespace "${NS}" >/dev/null
kc label namespace "${NS}" pod-security.kubernetes.io/enforce=restricted >/dev/null
kc -n "${NS}" wait --for=create serviceaccount/default --timeout=60s >/dev/null 2>&1 || true

t_debian() { pod smoke-debian "${DEBIAN_IMAGE}" Always sleep infinity; wait_phase smoke-debian Running 120; }
t_pause() { pod smoke-pause "${PAUSE_IMAGE}" Always; wait_phase smoke-pause Running 60; }
timed "debian pod Running" t_debian
timed "pause pod Running" t_pause

t_ray() {
  pod smoke-ray "${IMAGE_CPU}" Never python -c 'import ray; ray.init(); print("RESOURCES", ray.cluster_resources())'
  wait_phase smoke-ray Succeeded 300
  local out; out="$(kc -n "${NS}" logs smoke-ray)"
  grep -q "RESOURCES.*'CPU'" <<<"${out}" || fail "ray.init() printed no resources" smoke-ray
  log "$(grep RESOURCES <<<"${out}")"
}
timed "${IMAGE_CPU} pod ray.init()" t_ray

t_service() {
  pod smoke-web "${IMAGE_CPU}" Always python -m http.server 8080 --bind 0.0.0.0 --directory /tmp
  pod smoke-client "${IMAGE_CPU}" Always sleep infinity
  kc -n "${NS}" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: smoke-web}
spec:
  selector: {app: smoke-web}
  ports: [{port: 80, targetPort: 8080}]
EOF
  wait_phase smoke-web Running 120; wait_phase smoke-client Running 120
  kc -n "${NS}" wait --for=condition=Ready pod/smoke-web --timeout=60s >/dev/null
  local ip i; ip="$(kc -n "${NS}" get service smoke-web -o jsonpath='{.spec.clusterIP}')"
  for ((i = 0; i < 30; i++)); do curl -fsS --max-time 2 "http://${ip}/" >/dev/null 2>&1 && break; sleep 1; done
  curl -fsS --max-time 3 "http://${ip}/" >/dev/null || fail "Service smoke-web ${ip}:80 does not answer from the host"
  log "host -> Service ${ip}:80 answers"
  kc -n "${NS}" exec smoke-client -- python -c "
import urllib.request, ssl, socket
print('pod -> Service', '${ip}', urllib.request.urlopen('http://${ip}/', timeout=5).status)
print('pod -> Service by name', socket.gethostbyname('smoke-web.${NS}.svc.${CLUSTER_DOMAIN}'),
      urllib.request.urlopen('http://smoke-web/', timeout=5).status)
try:
    urllib.request.urlopen('https://${KUBERNETES_SVC_IP}/version', timeout=5, context=ssl._create_unverified_context())
    print('pod -> kubernetes Service answered')
except urllib.error.HTTPError as e:
    print('pod -> kubernetes Service answered HTTP', e.code)
" >&2 || fail "a pod cannot reach the Service smoke-web (${ip}), its DNS name or the kubernetes Service" smoke-client
  # hairpin: a pod reaching itself through its own Service
  kc -n "${NS}" exec smoke-web -- python -c "
import urllib.request
# the FQDN: the pod's /etc/hosts maps its own name smoke-web to its pod IP
print('pod -> its own Service (hairpin)', urllib.request.urlopen('http://smoke-web.${NS}.svc.${CLUSTER_DOMAIN}/', timeout=5).status)
" >&2 || fail "a pod cannot reach itself through its Service (hairpin)" smoke-web
}
timed "Service ClusterIP from host and pod" t_service

t_dns() {
  local out
  out="$(kc -n "${NS}" exec smoke-debian -- getent hosts "kubernetes.default.svc.${CLUSTER_DOMAIN}")" \
    || fail "kubernetes.default.svc.${CLUSTER_DOMAIN} does not resolve in a pod" smoke-debian
  [[ "${out}" == "${KUBERNETES_SVC_IP} "* ]] || fail "kubernetes.default.svc.${CLUSTER_DOMAIN} resolved to '${out}', not ${KUBERNETES_SVC_IP}"
  log "pod: ${out}"
  out="$(kc -n "${NS}" exec smoke-debian -- cat /etc/resolv.conf | tr '\n' ' ')"
  log "pod resolv.conf: ${out}"
}
timed "DNS in a pod" t_dns

IFS=','; log "all checks passed: ${FIGS[*]}"
