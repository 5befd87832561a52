#!/usr/bin/env bash
# Build the Kubernetes tools and schemas rl-platform's chart tests need, from the Go module proxy and PyPI,
# into a cache outside the repo keyed by version:
#   ${RLP_CACHE:-$HOME/.cache/rl-platform}/tools/<tool>-<version>/...
# Versions come from mk/versions.mk (the only place they are written down).
#
# Usage: hack/tools.sh [all|helm|kubeconform|helm-unittest|k8s-schemas|kuberay|prometheus-operator|kind|
#                       kuberay-operator-binary|env|paths]
#   all (default)  helm, kubeconform, helm-unittest, Kubernetes + KubeRay + prometheus-operator schemas
#   env            print NAME=path lines for the tools (used by mk/k8s.mk and tests/chart)
# Idempotent: every item is built into a temporary folder and renamed into place when complete, and an item
# whose final folder exists is not rebuilt, so a warm run only checks a handful of paths.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSIONS="${ROOT}/mk/versions.mk"

ver() { # ver NAME -> value of `NAME := value` in mk/versions.mk
  local v
  v="$(sed -n "s/^$1[[:space:]]*:=[[:space:]]*\(.*[^[:space:]]\)[[:space:]]*$/\1/p" "${VERSIONS}")"
  [[ -n "${v}" ]] || { echo "tools.sh: $1 missing from ${VERSIONS}" >&2; exit 2; }
  printf '%s' "${v}"
}

HELM_VERSION="$(ver HELM_VERSION)"
KUBECONFORM_VERSION="$(ver KUBECONFORM_VERSION)"
HELM_UNITTEST_VERSION="$(ver HELM_UNITTEST_VERSION)"
KIND_VERSION="$(ver KIND_VERSION)"
KUBERAY_VERSION="$(ver KUBERAY_VERSION)"
KUBERAY_CRD_FALLBACK_VERSION="$(sed -n 's/^KUBERAY_CRD_FALLBACK_VERSION[[:space:]]*:=[[:space:]]*\([^[:space:]]*\).*/\1/p' "${VERSIONS}")"
PROMETHEUS_OPERATOR_VERSION="$(ver PROMETHEUS_OPERATOR_VERSION)"
KUBERNETES_VALIDATE_VERSION="$(ver KUBERNETES_VALIDATE_VERSION)"
KUBE_VERSION="$(ver KUBE_VERSION)"

CACHE="${RLP_CACHE:-${HOME}/.cache/rl-platform}/tools"
HELM_DIR="${CACHE}/helm-${HELM_VERSION}"
KUBECONFORM_DIR="${CACHE}/kubeconform-${KUBECONFORM_VERSION}"
HELM_UNITTEST_DIR="${CACHE}/helm-unittest-${HELM_UNITTEST_VERSION}-helm-${HELM_VERSION}"
KIND_DIR="${CACHE}/kind-${KIND_VERSION}"
# The KubeRay CRDs/operator come from the ray-operator module of KUBERAY_VERSION, or (only while that version's zip
# is not served) of KUBERAY_CRD_FALLBACK_VERSION; the folder name says which one was used.
kuberay_dir() { printf '%s/kuberay-%s' "${CACHE}" "$1"; }
if [[ -d "$(kuberay_dir "${KUBERAY_VERSION}")/schemas" || -z "${KUBERAY_CRD_FALLBACK_VERSION}" ]]; then
  KUBERAY_DIR="$(kuberay_dir "${KUBERAY_VERSION}")"
elif [[ -d "$(kuberay_dir "${KUBERAY_CRD_FALLBACK_VERSION}")/schemas" ]]; then
  KUBERAY_DIR="$(kuberay_dir "${KUBERAY_CRD_FALLBACK_VERSION}")"
else
  KUBERAY_DIR=""  # decided by fetch_kuberay
fi
PROMOP_DIR="${CACHE}/prometheus-operator-${PROMETHEUS_OPERATOR_VERSION}"
K8S_SCHEMA_DIR="${CACHE}/kubernetes-validate-${KUBERNETES_VALIDATE_VERSION}"
# Python with pyyaml, for kubeconform's openapi2jsonschema.py (the repo venv by default).
PYTHON="${PYTHON:-${ROOT}/.venv/bin/python}"

log() { printf '[tools] %s\n' "$*" >&2; }
need() { command -v "$1" >/dev/null 2>&1 || { echo "tools.sh: '$1' is required ($2)" >&2; exit 2; }; }

# stage DIR: print a fresh temporary sibling of DIR; `publish` renames it to DIR once complete.
# A failed or interrupted build leaves nothing behind: the EXIT trap removes unpublished temporary folders.
STAGED=()
cleanup() { local d; for d in "${STAGED[@]+"${STAGED[@]}"}"; do [[ -e "${d}" ]] && chmod -R u+w "${d}" && rm -rf "${d}"; done; return 0; }
trap cleanup EXIT
stage() { mkdir -p "${CACHE}"; T="$(mktemp -d "$1.tmp.XXXXXX")"; STAGED+=("${T}"); }  # sets T
publish() { # publish TMP DIR
  if [[ -e "$2" ]]; then rm -rf "$1"; else mv "$1" "$2"; fi
}

moddir() { # moddir MODULE@VERSION -> extracted module folder in the Go module cache
  go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p'
}

# The k8s.io/client-go minor a helm release is built against: helm's own Makefile passes it as ldflags so
# `helm template` defaults to a current Kubernetes version instead of v1.20.
helm_ldflags() {
  local src="$1" minor
  minor="$(sed -n 's/^[[:space:]]*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "${src}/go.mod" | head -n1)"
  local f="-s -w -X helm.sh/helm/v3/internal/version.version=v${HELM_VERSION}"
  f+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  local pkg
  for pkg in pkg/lint/rules pkg/chartutil pkg/chart/common internal/chart/v3/lint/rules; do
    if grep -qs 'k8sVersionMajor' "${src}/${pkg}"/*.go; then
      f+=" -X helm.sh/helm/v3/${pkg}.k8sVersionMajor=1 -X helm.sh/helm/v3/${pkg}.k8sVersionMinor=${minor}"
    fi
  done
  printf '%s' "${f}"
}

build_helm() {
  [[ -x "${HELM_DIR}/bin/helm" ]] && return 0
  need go "Go toolchain, https://go.dev/dl/"
  log "building helm v${HELM_VERSION} (cold: a few minutes)"
  local t src; stage "${HELM_DIR}"; t="${T}"; src="$(moddir "helm.sh/helm/v3@v${HELM_VERSION}")"
  GOBIN="${t}/bin" CGO_ENABLED=0 go install -trimpath -ldflags "$(helm_ldflags "${src}")" \
    "helm.sh/helm/v3/cmd/helm@v${HELM_VERSION}"
  publish "${t}" "${HELM_DIR}"
}

build_kubeconform() {
  [[ -x "${KUBECONFORM_DIR}/bin/kubeconform" && -f "${KUBECONFORM_DIR}/share/openapi2jsonschema.py" ]] && return 0
  need go "Go toolchain"
  log "building kubeconform v${KUBECONFORM_VERSION}"
  local t src; stage "${KUBECONFORM_DIR}"; t="${T}"
  GOBIN="${t}/bin" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w -X main.version=v${KUBECONFORM_VERSION}" \
    "github.com/yannh/kubeconform/cmd/kubeconform@v${KUBECONFORM_VERSION}"
  # The CRD -> JSON schema converter ships in the same module.
  src="$(moddir "github.com/yannh/kubeconform@v${KUBECONFORM_VERSION}")"
  mkdir -p "${t}/share"; cp "${src}/scripts/openapi2jsonschema.py" "${t}/share/"
  publish "${t}" "${KUBECONFORM_DIR}"
}

# helm-unittest's go.mod has a replace directive, so `go install mod@v` refuses it: build it from a small wrapper
# module that repeats the replace. The wrapper also requires our pinned helm so the unit tests render with the
# same helm library as the helm binary (and the two builds share most of Go's build cache).
build_helm_unittest() {
  [[ -x "${HELM_UNITTEST_DIR}/bin/helm-unittest" ]] && return 0
  need go "Go toolchain"
  log "building helm-unittest v${HELM_UNITTEST_VERSION} against helm v${HELM_VERSION} (cold: a few minutes)"
  local t src; stage "${HELM_UNITTEST_DIR}"; t="${T}"
  src="$(moddir "github.com/helm-unittest/helm-unittest@v${HELM_UNITTEST_VERSION}")"
  mkdir -p "${t}/wrapper" "${t}/bin" "${t}/plugin/unittest"
  {
    echo "module rlplatform.local/tools/helmunittest"
    echo
    sed -n 's/^go \(.*\)$/go \1/p' "${src}/go.mod"
    echo
    echo "require ("
    echo "	github.com/helm-unittest/helm-unittest v${HELM_UNITTEST_VERSION}"
    echo "	helm.sh/helm/v3 v${HELM_VERSION}"
    echo ")"
    grep '^replace ' "${src}/go.mod" || true
  } > "${t}/wrapper/go.mod"
  cat > "${t}/wrapper/tools.go" <<'EOF'
//go:build tools

package tools

import _ "github.com/helm-unittest/helm-unittest"
EOF
  (cd "${t}/wrapper" && GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 || true
   cd "${t}/wrapper" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
     -o "${t}/bin/helm-unittest" github.com/helm-unittest/helm-unittest)
  # Also usable as `helm unittest` with HELM_PLUGINS=${HELM_UNITTEST_DIR}/plugin.
  sed -e 's#^\(.*command:\).*#\1 "$HELM_PLUGIN_DIR/untt"#' "${src}/plugin.yaml" > "${t}/plugin/unittest/plugin.yaml" 2>/dev/null || true
  ln -sf ../../bin/helm-unittest "${t}/plugin/unittest/untt"
  publish "${t}" "${HELM_UNITTEST_DIR}"
}

build_kind() {
  [[ -x "${KIND_DIR}/bin/kind" ]] && return 0
  need go "Go toolchain"
  log "building kind v${KIND_VERSION}"
  local t; stage "${KIND_DIR}"; t="${T}"
  GOBIN="${t}/bin" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kind@v${KIND_VERSION}"
  publish "${t}" "${KIND_DIR}"
}

# convert_crds SRC_GLOB... -> JSON schemas named {kind}_{version}.json in ./ (run inside the target folder)
convert_crds() {
  [[ -x "${PYTHON}" ]] || PYTHON="$(command -v python3)"
  "${PYTHON}" -c 'import yaml' 2>/dev/null || { echo "tools.sh: ${PYTHON} lacks pyyaml (needed by openapi2jsonschema.py)" >&2; exit 2; }
  FILENAME_FORMAT='{kind}_{version}' "${PYTHON}" "${KUBECONFORM_DIR}/share/openapi2jsonschema.py" "$@" >/dev/null
}

fetch_kuberay() {
  [[ -n "${KUBERAY_DIR}" && -d "${KUBERAY_DIR}/schemas" && -d "${KUBERAY_DIR}/crds" ]] && return 0
  need go "Go toolchain"; build_kubeconform
  local v src="" t
  for v in "${KUBERAY_VERSION}" ${KUBERAY_CRD_FALLBACK_VERSION}; do
    log "fetching KubeRay v${v} CRDs from github.com/ray-project/kuberay/ray-operator"
    if src="$(moddir "github.com/ray-project/kuberay/ray-operator@v${v}" 2>/dev/null)" && [[ -n "${src}" ]]; then
      break
    fi
    src=""
    log "WARNING: github.com/ray-project/kuberay/ray-operator@v${v} is not downloadable from $(go env GOPROXY)"
  done
  [[ -n "${src}" ]] || { echo "tools.sh: no KubeRay CRDs could be downloaded (tried ${KUBERAY_VERSION} ${KUBERAY_CRD_FALLBACK_VERSION})" >&2; exit 2; }
  [[ "${v}" == "${KUBERAY_VERSION}" ]] || log "WARNING: validating against KubeRay v${v} CRDs instead of v${KUBERAY_VERSION} (KUBERAY_CRD_FALLBACK_VERSION in mk/versions.mk)"
  KUBERAY_DIR="$(kuberay_dir "${v}")"
  [[ -d "${KUBERAY_DIR}/schemas" ]] && return 0
  stage "${KUBERAY_DIR}"; t="${T}"
  mkdir -p "${t}/crds" "${t}/schemas"
  cp "${src}"/config/crd/bases/ray.io_*.yaml "${t}/crds/"
  chmod -R u+w "${t}/crds"
  echo "${v}" > "${t}/VERSION"
  (cd "${t}/schemas" && convert_crds "${t}"/crds/*.yaml)
  publish "${t}" "${KUBERAY_DIR}"
}

# The operator binary of the same KubeRay version, for running it outside a cluster (optional; the in-cluster
# operator comes from the upstream kuberay-operator chart/image of the same version).
build_kuberay_operator() {
  fetch_kuberay
  [[ -x "${KUBERAY_DIR}/bin/ray-operator" ]] && return 0
  log "building ray-operator v${KUBERAY_VERSION}"
  GOBIN="${KUBERAY_DIR}/bin.tmp" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
    "github.com/ray-project/kuberay/ray-operator@v$(cat "${KUBERAY_DIR}/VERSION")"
  mv "${KUBERAY_DIR}/bin.tmp" "${KUBERAY_DIR}/bin"
}

fetch_prometheus_operator() {
  [[ -d "${PROMOP_DIR}/schemas" && -d "${PROMOP_DIR}/crds" ]] && return 0
  need go "Go toolchain"; build_kubeconform
  log "fetching prometheus-operator v${PROMETHEUS_OPERATOR_VERSION} CRDs"
  local t src; stage "${PROMOP_DIR}"; t="${T}"
  src="$(moddir "github.com/prometheus-operator/prometheus-operator@v${PROMETHEUS_OPERATOR_VERSION}")"
  mkdir -p "${t}/crds" "${t}/schemas"
  cp "${src}"/example/prometheus-operator-crd/monitoring.coreos.com_*.yaml "${t}/crds/"
  chmod -R u+w "${t}/crds"
  (cd "${t}/schemas" && convert_crds "${t}"/crds/*.yaml)
  publish "${t}" "${PROMOP_DIR}"
}

# Kubernetes' own JSON schemas, offline, from the PyPI package kubernetes-validate (a plain wheel download; nothing
# is installed). Its schemas point at "/api/_definitions.json"; kubeconform resolves $refs relative to the file.
fetch_k8s_schemas() {
  local kv="v${KUBE_VERSION%.*}.0"
  [[ -d "${K8S_SCHEMA_DIR}/${kv}-local-strict" ]] && return 0
  log "fetching Kubernetes ${kv} JSON schemas (PyPI kubernetes-validate==${KUBERNETES_VALIDATE_VERSION})"
  local t pip; stage "${K8S_SCHEMA_DIR}"; t="${T}"
  pip="${ROOT}/.venv/bin/pip"; [[ -x "${pip}" ]] || pip="python3 -m pip"
  ${pip} download --quiet --no-deps --only-binary=:all: -d "${t}/wheel" "kubernetes-validate==${KUBERNETES_VALIDATE_VERSION}"
  "${PYTHON}" - "${t}" "${kv}" <<'EOF'
import pathlib, sys, zipfile
out, kv = pathlib.Path(sys.argv[1]), sys.argv[2]
whl = next((out / "wheel").glob("*.whl"))
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        parts = name.split("/")
        if len(parts) == 4 and parts[1] == "kubernetes-json-schema" and parts[2] in (f"{kv}-local", f"{kv}-local-strict"):
            text = z.read(name).decode().replace('"/api/_definitions.json#', '"_definitions.json#')
            dest = out / parts[2] / parts[3]
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
EOF
  rm -rf "${t}/wheel"
  [[ -f "${t}/${kv}-local-strict/deployment-apps-v1.json" ]] || { echo "tools.sh: no ${kv} schemas in kubernetes-validate ${KUBERNETES_VALIDATE_VERSION}" >&2; exit 2; }
  publish "${t}" "${K8S_SCHEMA_DIR}"
}

print_env() {
  [[ -n "${KUBERAY_DIR}" ]] || KUBERAY_DIR="$(kuberay_dir "${KUBERAY_VERSION}")"
  cat <<EOF
HELM=${HELM_DIR}/bin/helm
KUBECONFORM=${KUBECONFORM_DIR}/bin/kubeconform
HELM_UNITTEST=${HELM_UNITTEST_DIR}/bin/helm-unittest
KIND=${KIND_DIR}/bin/kind
KUBERAY_CRDS=${KUBERAY_DIR}/crds
KUBERAY_SCHEMAS=${KUBERAY_DIR}/schemas
KUBERAY_VERSION=${KUBERAY_VERSION}
PROMETHEUS_OPERATOR_CRDS=${PROMOP_DIR}/crds
PROMETHEUS_OPERATOR_SCHEMAS=${PROMOP_DIR}/schemas
K8S_SCHEMAS=${K8S_SCHEMA_DIR}
KUBE_VERSION=${KUBE_VERSION}
EOF
}

timed() { local s=$SECONDS; "$@"; log "$1 done in $((SECONDS - s))s"; }

case "${1:-all}" in
  all)
    timed build_kubeconform; timed fetch_k8s_schemas; timed fetch_kuberay; timed fetch_prometheus_operator
    timed build_helm; timed build_helm_unittest ;;
  helm) build_helm ;;
  kubeconform) build_kubeconform ;;
  helm-unittest) build_helm_unittest ;;
  kind) build_kind ;;
  k8s-schemas) fetch_k8s_schemas ;;
  kuberay) fetch_kuberay ;;
  kuberay-operator-binary) build_kuberay_operator ;;
  prometheus-operator) fetch_prometheus_operator ;;
  env) print_env ;;
  *) echo "usage: $0 [all|helm|kubeconform|helm-unittest|kind|k8s-schemas|kuberay|kuberay-operator-binary|prometheus-operator|env]" >&2; exit 2 ;;
esac
