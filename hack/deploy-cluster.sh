#!/usr/bin/env bash
# `make deploy-cluster` / `make undeploy`: a kind cluster with the KubeRay operator, optionally kube-prometheus-stack,
# the rl-platform images and the chart. Runs on a machine with Docker and internet access (kind's node image and
# the upstream charts are downloaded); versions come from mk/versions.mk.
#   hack/deploy-cluster.sh up|down      env: KIND_CLUSTER, K8S_NAMESPACE, MONITORING=0|1
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
eval "$(hack/tools.sh env | sed 's/^/export /')"
ver() { sed -n "s/^$1[[:space:]]*:=[[:space:]]*\([^[:space:]]*\).*/\1/p" mk/versions.mk; }
KUBERAY_VERSION="$(ver KUBERAY_VERSION)"
KPS_VERSION="$(ver KUBE_PROMETHEUS_STACK_VERSION)"
IMAGE_CPU="$(ver IMAGE_CPU)"
IMAGE_GPU="$(ver IMAGE_GPU)"
KIND_CLUSTER="${KIND_CLUSTER:-rl-platform}"
NS="${K8S_NAMESPACE:-rl-platform}"
MONITORING="${MONITORING:-0}"
CTX="kind-${KIND_CLUSTER}"
# Where every kind node mounts its shared storage from (k8s/kind/cluster.yaml).
HOST_STORAGE=/tmp/rl-platform

die() { echo "deploy-cluster: $*" >&2; exit 1; }
step() { printf '\n==> %s\n' "$*"; }

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

  step "rl-platform chart (release rl-platform in ${NS})"
  "${HELM}" upgrade --install rl-platform charts/rl-platform --kube-context "${CTX}" \
    --namespace "${NS}" --create-namespace -f k8s/values/kind.yaml "${mon_args[@]}"

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
  up) up ;;
  down) down ;;
  *) die "usage: $0 up|down" ;;
esac
