#!/usr/bin/env bash
# Build the Kubernetes tools and schemas rl-platform's chart tests need, from the Go module proxy and PyPI,
# into a cache outside the repo keyed by version:
#   ${RLP_CACHE:-$HOME/.cache/rl-platform}/tools/<tool>-<version>/...
# Versions come from mk/versions.mk (the only place they are written down).
#
# Usage: hack/tools.sh [all|helm|kubeconform|helm-unittest|k8s-schemas|kuberay|prometheus-operator|promtool|
#                       pod-security-check|kind|kuberay-operator-binary|env]
#   all (default)  helm, kubeconform, helm-unittest, Kubernetes + KubeRay + prometheus-operator schemas, promtool,
#                  pod-security-check (what `make test` needs)
#   kind, kuberay-operator-binary   on demand (`make deploy-cluster`, running the operator outside a cluster)
#   env            print NAME=path lines for the tools (used by mk/k8s.mk, hack/*.sh and tests/chart)
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
PSA_VERSION="$(ver POD_SECURITY_ADMISSION_VERSION)"

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
# Our own small checker (hack/pod-security-check) over the upstream policy code: keyed by its source too.
PSA_SRC="${ROOT}/hack/pod-security-check"
PSA_DIR="${CACHE}/pod-security-check-${PSA_VERSION}-$(cat "${PSA_SRC}/main.go" | sha256sum | cut -c1-12)"
# Python with pyyaml, for kubeconform's openapi2jsonschema.py (the repo venv by default).
PYTHON="${PYTHON:-${ROOT}/.venv/bin/python}"

# The Go toolchain's usual home, for shells whose PATH lacks it (e.g. a CI runner's).
command -v go >/dev/null 2>&1 || { [[ -x /usr/local/go/bin/go ]] && PATH="${PATH}:/usr/local/go/bin"; }

log() { printf '[tools] %s\n' "$*" >&2; }
need() { command -v "$1" >/dev/null 2>&1 || { echo "tools.sh: '$1' is required ($2)" >&2; exit 2; }; }

# stage DIR: make a fresh temporary sibling of DIR in $T; `publish` renames it to DIR once complete.
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
  cat > "${t}/wrapper/tools.go" <<'GO'
//go:build tools

package tools

import _ "github.com/helm-unittest/helm-unittest/cmd/helm-unittest"
GO
  (cd "${t}/wrapper" && go mod tidy 2>&1 | grep -v '^go: downloading' >&2 || true) 
  # helm's Kubernetes-version ldflags too, so the unit tests' default capabilities match `helm template`'s.
  local helm_src; helm_src="$(moddir "helm.sh/helm/v3@v${HELM_VERSION}")"
  (cd "${t}/wrapper" && CGO_ENABLED=0 go build -trimpath -ldflags "$(helm_ldflags "${helm_src}")" \
     -o "${t}/bin/helm-unittest" github.com/helm-unittest/helm-unittest/cmd/helm-unittest)
  # Also usable as `helm unittest ...` with HELM_PLUGINS=${HELM_UNITTEST_DIR}/plugin.
  printf '%s\n' 'name: "unittest"' "version: \"${HELM_UNITTEST_VERSION}\"" 'usage: "unittest for helm charts"' \
    'description: "helm-unittest built by rl-platform hack/tools.sh"' 'command: "$HELM_PLUGIN_DIR/untt"' \
    > "${t}/plugin/unittest/plugin.yaml"
  ln -sf ../../bin/helm-unittest "${t}/plugin/unittest/untt"
  publish "${t}" "${HELM_UNITTEST_DIR}"
}

build_pod_security_check() {
  [[ -x "${PSA_DIR}/bin/pod-security-check" ]] && return 0
  need go "Go toolchain"
  log "building pod-security-check (k8s.io/pod-security-admission v${PSA_VERSION})"
  local t; stage "${PSA_DIR}"; t="${T}"
  mkdir -p "${t}/src" "${t}/bin"
  cp "${PSA_SRC}/main.go" "${t}/src/"
  printf 'module rlplatform.local/tools/podsecuritycheck\n\ngo 1.26\n\nrequire k8s.io/pod-security-admission v%s\n' \
    "${PSA_VERSION}" > "${t}/src/go.mod"
  (cd "${t}/src" && go mod tidy 2>&1 | grep -v '^go: downloading' >&2 || true)
  (cd "${t}/src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "${t}/bin/pod-security-check" .)
  publish "${t}" "${PSA_DIR}"
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
  local v; v="$(cat "${KUBERAY_DIR}/VERSION")"
  log "building ray-operator v${v} (the KubeRay operator binary, for running it outside a cluster)"
  rm -rf "${KUBERAY_DIR}/bin.tmp"
  GOBIN="${KUBERAY_DIR}/bin.tmp" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
    "github.com/ray-project/kuberay/ray-operator@v${v}"
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
import json, pathlib, sys, zipfile
out, kv = pathlib.Path(sys.argv[1]), sys.argv[2]
whl = next((out / "wheel").glob("*.whl"))
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        parts = name.split("/")
        if len(parts) == 4 and parts[1] == "kubernetes-json-schema" and parts[2] in (f"{kv}-local", f"{kv}-local-strict"):
            doc = json.loads(z.read(name).decode().replace('"/api/_definitions.json#', '"_definitions.json#'))
            doc.pop("$id", None)  # an https://kubernetes.io/... $id would make refs resolve against the web
            dest = out / parts[2] / parts[3]
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(json.dumps(doc))
EOF
  rm -rf "${t}/wheel"
  [[ -f "${t}/${kv}-local-strict/deployment-apps-v1.json" ]] || { echo "tools.sh: no ${kv} schemas in kubernetes-validate ${KUBERNETES_VALIDATE_VERSION}" >&2; exit 2; }
  publish "${t}" "${K8S_SCHEMA_DIR}"
}

# promtool (PrometheusRule checks) from Debian's prometheus package: downloaded and unpacked into the cache, not
# installed, so no Prometheus service is set up or started. The package version is part of the folder name.
promtool_dir() {
  local v d
  # A promtool already in the cache wins (apt-cache is slow); the newest package version if several.
  d="$(ls -d "${CACHE}"/promtool-*/bin/promtool 2>/dev/null | sort -V | tail -n1)"
  [[ -n "${d}" ]] && { printf '%s' "${d%/bin/promtool}"; return 0; }
  v="$(apt-cache policy prometheus 2>/dev/null | sed -n 's/^[[:space:]]*Candidate:[[:space:]]*\([^[:space:]]*\).*/\1/p')"
  [[ -n "${v}" && "${v}" != "(none)" ]] && printf '%s/promtool-%s' "${CACHE}" "${v//[^A-Za-z0-9.+-]/_}"
}
fetch_promtool() {
  local dir; dir="$(promtool_dir || true)"
  if [[ -z "${dir}" ]] && command -v apt-get >/dev/null && [[ "$(id -u)" == 0 ]]; then
    log "apt-get update (apt knows no prometheus package yet)"; apt-get update -qq >/dev/null; dir="$(promtool_dir || true)"
  fi
  [[ -n "${dir}" ]] || { log "WARNING: no Debian prometheus package visible to apt: promtool not fetched"; return 0; }
  [[ -x "${dir}/bin/promtool" ]] && return 0
  log "fetching promtool from Debian package prometheus (${dir##*/promtool-})"
  local t; stage "${dir}"; t="${T}"
  (cd "${t}" && apt-get download -qq prometheus 2>/dev/null && dpkg-deb -x prometheus_*.deb root)
  mkdir -p "${t}/bin" && mv "${t}/root/usr/bin/promtool" "${t}/bin/" && rm -rf "${t}/root" "${t}"/prometheus_*.deb
  publish "${t}" "${dir}"
}

print_env() {
  [[ -n "${KUBERAY_DIR}" ]] || KUBERAY_DIR="$(kuberay_dir "${KUBERAY_VERSION}")"
  cat <<EOF
HELM=${HELM_DIR}/bin/helm
KUBECONFORM=${KUBECONFORM_DIR}/bin/kubeconform
HELM_UNITTEST=${HELM_UNITTEST_DIR}/bin/helm-unittest
KIND=${KIND_DIR}/bin/kind
POD_SECURITY_CHECK=${PSA_DIR}/bin/pod-security-check
KUBERAY_CRDS=${KUBERAY_DIR}/crds
KUBERAY_SCHEMAS=${KUBERAY_DIR}/schemas
KUBERAY_VERSION=${KUBERAY_VERSION}
PROMETHEUS_OPERATOR_CRDS=${PROMOP_DIR}/crds
PROMETHEUS_OPERATOR_SCHEMAS=${PROMOP_DIR}/schemas
K8S_SCHEMAS=${K8S_SCHEMA_DIR}
PROMTOOL=$(d="$(promtool_dir || true)"; [[ -n "${d}" ]] && echo "${d}/bin/promtool")
KUBE_VERSION=${KUBE_VERSION}
EOF
}

timed() { local s=$SECONDS; "$@"; log "$1 done in $((SECONDS - s))s"; }

main() {
  case "${1:-all}" in
    all)
      timed build_kubeconform; timed fetch_k8s_schemas; timed fetch_kuberay; timed fetch_prometheus_operator
      timed build_helm; timed build_helm_unittest; timed build_pod_security_check; timed fetch_promtool ;;
    helm) build_helm ;;
    kubeconform) build_kubeconform ;;
    helm-unittest) build_helm_unittest ;;
    kind) build_kind ;;
    k8s-schemas) fetch_k8s_schemas ;;
    kuberay) fetch_kuberay ;;
    kuberay-operator-binary) build_kuberay_operator ;;
    prometheus-operator) fetch_prometheus_operator ;;
    promtool) fetch_promtool ;;
    pod-security-check) build_pod_security_check ;;
    env) print_env ;;
    *) echo "usage: $0 [all|helm|kubeconform|helm-unittest|kind|k8s-schemas|kuberay|kuberay-operator-binary|prometheus-operator|promtool|pod-security-check|env]" >&2; exit 2 ;;
  esac
}

# One line, parsed whole before it runs: editing this file while it runs cannot change what it does.
{ main "$@"; exit $?; }
