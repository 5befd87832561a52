#!/usr/bin/env bash
# `make deploy-cluster` / `make undeploy`: a cluster with the KubeRay operator, the rl-platform images and the chart
# release in a namespace that enforces the "restricted" Pod Security Standard. Two kinds of cluster:
#   CLUSTER=local  the cluster tier built here from registry sources (hack/cluster.sh; LEVEL=a fake nodes only,
#                  LEVEL=b this machine as a real node). Needs root, no registry, no internet.
#   CLUSTER=kind   kind on Docker (users' laptops: kind's node image and the upstream charts are downloaded),
#                  optionally kube-prometheus-stack (MONITORING=1).
#   CLUSTER=auto   (default) kind when a `kind` is on PATH and the Docker daemon answers, else local.
# Versions come from mk/versions.mk.
#   hack/deploy-cluster.sh up|down      env: CLUSTER, LEVEL, KIND_CLUSTER, K8S_NAMESPACE, MONITORING=0|1
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
eval "$(hack/tools.sh env | sed 's/^/export /')"
ver() { sed -n "s/^$1[[:space:]]*:=[[:space:]]*\([^[:space:]]*\).*/\1/p" mk/versions.mk; }
KUBERAY_VERSION="$(ver KUBERAY_VERSION)"
KPS_VERSION="$(ver KUBE_PROMETHEUS_STACK_VERSION)"
KUEUE_VERSION="$(ver KUEUE_VERSION)"
IMAGE_CPU="$(ver IMAGE_CPU)"
IMAGE_GPU="$(ver IMAGE_GPU)"
KIND_CLUSTER="${KIND_CLUSTER:-rl-platform}"
NS="${K8S_NAMESPACE:-rl-platform}"
MONITORING="${MONITORING:-0}"
CTX="kind-${KIND_CLUSTER}"
CLUSTER="${CLUSTER:-auto}"
LEVEL="${LEVEL:-b}"
# Where every kind node mounts its shared storage from (k8s/kind/cluster.yaml).
HOST_STORAGE=/tmp/rl-platform

die() { echo "deploy-cluster: $*" >&2; exit 1; }
step() { printf '\n==> %s\n' "$*"; }

# Label a namespace so the API server enforces (and warns/audits on) the restricted Pod Security Standard.
restricted_namespace() { # restricted_namespace KUBECTL_ARGS...
  "$@" create namespace "${NS}" --dry-run=client -o yaml | "$@" apply -f - >/dev/null
  "$@" label --overwrite namespace "${NS}" pod-security.kubernetes.io/enforce=restricted \
    pod-security.kubernetes.io/enforce-version=latest pod-security.kubernetes.io/warn=restricted \
    pod-security.kubernetes.io/audit=restricted >/dev/null
}

pick_cluster() {
  case "${CLUSTER}" in
    local|kind) ;;
    auto) if command -v kind >/dev/null && docker info >/dev/null 2>&1; then CLUSTER=kind; KIND="$(command -v kind)"; else CLUSTER=local; fi
          step "CLUSTER=auto -> ${CLUSTER}" ;;
    *) die "CLUSTER must be local, kind or auto, not '${CLUSTER}'" ;;
  esac
}

# The local cluster tier: hack/cluster.sh brings it up (idempotent); the release is the same as on kind, with the
# PersistentVolume on this machine's /tmp/rl-platform instead of kind's node mount.
up_local() {
  [[ "${LEVEL}" == a || "${LEVEL}" == b ]] || die "LEVEL must be a or b, not '${LEVEL}'"
  step "local cluster (level ${LEVEL}): hack/cluster.sh up"
  local envline; envline="$("${ROOT}/hack/cluster.sh" up --level "${LEVEL}")" || die "the local cluster did not come up (see above)"
  eval "${envline}"
  local k=(kubectl --kubeconfig "${KUBECONFIG}")
  mkdir -p "${HOST_STORAGE}" && chown 1000:1000 "${HOST_STORAGE}"  # Ray runs as uid 1000 and writes checkpoints there
  step "namespace ${NS} (enforces the restricted Pod Security Standard)"
  restricted_namespace "${k[@]}"
  step "rl-platform chart (release rl-platform in ${NS})"
  "${HELM}" upgrade --install rl-platform charts/rl-platform --kubeconfig "${KUBECONFIG}" --namespace "${NS}" \
    -f k8s/values/kind.yaml -f k8s/values/local.yaml --set monitoring.enabled=false
  if [[ "${LEVEL}" == b ]]; then
    step "waiting for the RayCluster head (real pod on this machine)"
    local node sel=ray.io/node-type=head,app.kubernetes.io/instance=rl-platform,rl-platform.io/workload=cluster deadline=$((SECONDS + 300))
    node="$("${k[@]}" get node -l rl-platform.io/node=real -o jsonpath='{.items[0].metadata.name}')"
    [[ -n "${node}" ]] || die "level b: no real node registered (hack/cluster.sh status)"
    # The operator may not have (re)created the head yet, and `kubectl wait` fails at once on no match: poll for it.
    until [[ -n "$("${k[@]}" -n "${NS}" get pod -l "${sel}" --field-selector "spec.nodeName=${node}" -o name 2>/dev/null)" ]]; do
      ((SECONDS < deadline)) || die "no RayCluster head pod on node ${node} after 300s (kubectl -n ${NS} get pods -o wide)"
      sleep 1
    done
    "${k[@]}" -n "${NS}" wait --for condition=Ready pod -l "${sel}" --field-selector "spec.nodeName=${node}" \
      --timeout "$((deadline - SECONDS))s" >/dev/null ||
      die "the RayCluster head did not become Ready (kubectl -n ${NS} describe pod -l ${sel})"
  fi
  cat <<MSG

Deployed on the local cluster (level ${LEVEL}). Next:
  ${envline}
  kubectl -n ${NS} get rayclusters,pods -o wide
  kubectl -n ${NS} apply -f k8s/jobs/cartpole.yaml     # CPU-only training, minutes
  kubectl -n ${NS} get rayjob rl-platform-cartpole -w
MSG
}

down_local() {
  if [[ -s "$("${ROOT}/hack/cluster.sh" env | sed -n 's/^export KUBECONFIG=\([^ ]*\) .*/\1/p')" ]]; then
    eval "$("${ROOT}/hack/cluster.sh" env)"
    "${HELM}" uninstall rl-platform --kubeconfig "${KUBECONFIG}" --namespace "${NS}" --ignore-not-found || true
  fi
  "${ROOT}/hack/cluster.sh" down
}

preflight() {
  [[ -x "${KIND}" ]] || die "kind is not built (${KIND}); run 'make kind-tool'"
  command -v docker >/dev/null || die "Docker is required: kind runs Kubernetes nodes as Docker containers"
  docker info >/dev/null 2>&1 || die "the Docker daemon is not reachable ('docker info' fails): start Docker first"
}

up() {
  preflight
  if ! "${KIND}" get clusters 2>/dev/null | grep -qx "${KIND_CLUSTER}"; then
    step "creating kind cluster ${KIND_CLUSTER} (k8s/kind/cluster.yaml)"
    mkdir -p "${HOST_STORAGE}" && chmod 0777 "${HOST_STORAGE}"  # Ray runs as uid 1000 and writes checkpoints there
    "${KIND}" create cluster --name "${KIND_CLUSTER}" --config k8s/kind/cluster.yaml --wait 180s ||
      die "kind could not create the cluster (it pulls its node image: is there internet access?)"
  else
    step "kind cluster ${KIND_CLUSTER} exists"
  fi

  step "KubeRay operator v${KUBERAY_VERSION} (upstream kuberay-operator chart, its own release in kuberay-system)"
  "${HELM}" upgrade --install kuberay-operator kuberay-operator --kube-context "${CTX}" \
    --repo https://ray-project.github.io/kuberay-helm/ --version "${KUBERAY_VERSION}" \
    --namespace kuberay-system --create-namespace --wait --timeout 5m

  # Kueue's own release manifests (CRDs, the controller manager with its webhooks and their self-managed
  # certificates, in kueue-system); the release then creates its queue (kueue.enabled: LocalQueue `training`, the
  # chart's ClusterQueue, ResourceFlavors and WorkloadPriorityClasses), as the local cluster tier does.
  step "Kueue v${KUEUE_VERSION} (its release manifests, in kueue-system)"
  local k=("${KUBECTL:-kubectl}" --context "${CTX}")
  "${k[@]}" apply --server-side --force-conflicts \
    -f "https://github.com/kubernetes-sigs/kueue/releases/download/v${KUEUE_VERSION}/manifests.yaml" >/dev/null ||
    die "Kueue v${KUEUE_VERSION}'s manifests could not be applied (they are downloaded from github.com)"
  "${k[@]}" -n kueue-system wait --for condition=Available deployment/kueue-controller-manager --timeout 300s ||
    die "Kueue's controller manager is not Available after 300s (kubectl -n kueue-system describe deployment)"

  local mon_args=(--set monitoring.enabled=false)
  if [[ "${MONITORING}" == 1 ]]; then
    step "kube-prometheus-stack ${KPS_VERSION} in monitoring (Grafana allows embedding in the Ray dashboard)"
    "${HELM}" upgrade --install kube-prometheus-stack kube-prometheus-stack --kube-context "${CTX}" \
      --repo https://prometheus-community.github.io/helm-charts --version "${KPS_VERSION}" \
      --namespace monitoring --create-namespace --wait --timeout 10m \
      --set grafana.sidecar.dashboards.enabled=true \
      --set grafana.sidecar.dashboards.searchNamespace=ALL \
      --set grafana.sidecar.dashboards.folderAnnotation=grafana_folder \
      --set grafana.sidecar.dashboards.provider.foldersFromFilesStructure=true \
      --set 'grafana.grafana\.ini.security.allow_embedding=true' \
      --set 'grafana.grafana\.ini.auth\.anonymous.enabled=true' \
      --set prometheus.prometheusSpec.podMonitorSelectorNilUsesHelmValues=false \
      --set prometheus.prometheusSpec.ruleSelectorNilUsesHelmValues=false
    mon_args=(--set monitoring.enabled=true)
  fi

  step "images ${IMAGE_CPU} ${IMAGE_GPU}"
  if ! docker image inspect "${IMAGE_CPU}" >/dev/null 2>&1; then
    if make -n images >/dev/null 2>&1; then make images; else die "image ${IMAGE_CPU} is missing and there is no 'make images' target"; fi
  fi
  "${KIND}" load docker-image "${IMAGE_CPU}" --name "${KIND_CLUSTER}"
  if docker image inspect "${IMAGE_GPU}" >/dev/null 2>&1; then
    "${KIND}" load docker-image "${IMAGE_GPU}" --name "${KIND_CLUSTER}"
  else
    echo "note: ${IMAGE_GPU} not built; GPU learners (k8s/jobs/pong.yaml) need it and a GPU node"
  fi

  step "namespace ${NS} (enforces the restricted Pod Security Standard)"
  restricted_namespace "${KUBECTL:-kubectl}" --context "${CTX}"
  step "rl-platform chart (release rl-platform in ${NS})"
  "${HELM}" upgrade --install rl-platform charts/rl-platform --kube-context "${CTX}" \
    --namespace "${NS}" -f k8s/values/kind.yaml --set kueue.enabled=true "${mon_args[@]}"

  cat <<MSG

Deployed. Next:
  kubectl --context ${CTX} -n ${NS} get rayclusters,pods
  kubectl --context ${CTX} -n ${NS} apply -f k8s/jobs/cartpole.yaml     # CPU-only training, minutes
  kubectl --context ${CTX} -n ${NS} port-forward svc/rl-platform-head-svc 8265   # Ray dashboard
MSG
}

down() {
  [[ -x "${KIND}" ]] || die "kind is not built (${KIND}); run 'make kind-tool'"
  if "${KIND}" get clusters 2>/dev/null | grep -qx "${KIND_CLUSTER}"; then
    "${HELM}" uninstall rl-platform --kube-context "${CTX}" --namespace "${NS}" --ignore-not-found || true
    "${HELM}" uninstall kube-prometheus-stack --kube-context "${CTX}" --namespace monitoring --ignore-not-found || true
    "${HELM}" uninstall kuberay-operator --kube-context "${CTX}" --namespace kuberay-system --ignore-not-found || true
    "${KIND}" delete cluster --name "${KIND_CLUSTER}"
  else
    echo "no kind cluster ${KIND_CLUSTER}"
  fi
}

case "${1:-}" in
  up) pick_cluster; if [[ "${CLUSTER}" == local ]]; then up_local; else up; fi ;;
  down) pick_cluster; if [[ "${CLUSTER}" == local ]]; then down_local; else down; fi ;;
  *) die "usage: $0 up|down" ;;
esac
