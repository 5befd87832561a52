#!/usr/bin/env bash
# Build the Kubernetes tools and schemas rl-platform's chart tests need, from the Go module proxy and PyPI,
# into a cache outside the repo keyed by version:
#   ${RLP_CACHE:-$HOME/.cache/rl-platform}/tools/<tool>-<version>/...
# Versions come from mk/versions.mk (the only place they are written down).
#
# Usage: hack/tools.sh [all|helm|kubeconform|helm-unittest|k8s-schemas|kuberay|kueue|prometheus-operator|promtool|
#                       prometheus|pod-security-check|kind|kuberay-operator-binary|kueue-binary|cluster|cluster-a|
#                       cluster-b|prometheus-k8s|env]
#   all (default)  helm, kubeconform, helm-unittest, Kubernetes + KubeRay + Kueue + prometheus-operator schemas,
#                  promtool, pod-security-check, the Prometheus server (what `make test` needs)
#   kind, kuberay-operator-binary   on demand (`make deploy-cluster`, running the operator outside a cluster)
#   cluster        what the local cluster tier needs (hack/cluster.sh, tests/k8s): Kubernetes, etcd, kwok, CoreDNS,
#                  the pause image, the KubeRay operator binary, the Kueue manager, and prometheus-k8s (upstream
#                  Prometheus + promtool with kubernetes_sd, to scrape the chart's PodMonitors)
#   cluster-a      the part of `cluster` Level A needs (etcd, Kubernetes, kwok, the KubeRay operator, Kueue)
#   cluster-b      what Level B's real node adds (CoreDNS, the pause image)
#   prometheus-k8s the rest of `cluster`, used only by the PodMonitor tests (tests/k8s/test_2b, tests/monitoring)
#   env            print NAME=path lines for the tools (used by mk/k8s.mk, hack/*.sh and tests/chart)
# Several targets may be given (`all cluster`); Go's caches are pruned once, after the last.
# Idempotent: every item is built into a temporary folder and renamed into place when complete, and an item
# whose final folder exists is not rebuilt, so a warm run only checks a handful of paths.
# Concurrent runs (`make test`'s background build, hack/background.sh, and a test's `hack/cluster.sh up`, or two
# shells) wait for each other: one lock per phase (`all`: the chart tools; `cluster`, `cluster-b` and
# `prometheus-k8s`: the cluster tier's binaries in three parts), so the chart tools are usable while the cluster
# binaries still build, Level A while part b does, Level B's node while Prometheus does, and Go's caches are pruned
# only when no other run is using them.
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
PROMETHEUS_OPERATOR_VERSION="$(ver PROMETHEUS_OPERATOR_VERSION)"
KUBERNETES_VALIDATE_VERSION="$(ver KUBERNETES_VALIDATE_VERSION)"
KUBE_VERSION="$(ver KUBE_VERSION)"
PSA_VERSION="$(ver POD_SECURITY_ADMISSION_VERSION)"
KUBERNETES_VERSION="$(ver KUBERNETES_VERSION)"
ETCD_VERSION="$(ver ETCD_VERSION)"
KWOK_VERSION="$(ver KWOK_VERSION)"
COREDNS_VERSION="$(ver COREDNS_VERSION)"
PROMETHEUS_K8S_VERSION="$(ver PROMETHEUS_K8S_VERSION)"
KUEUE_VERSION="$(ver KUEUE_VERSION)"

CACHE="${RLP_CACHE:-${HOME}/.cache/rl-platform}/tools"
HELM_DIR="${CACHE}/helm-${HELM_VERSION}"
KUBECONFORM_DIR="${CACHE}/kubeconform-${KUBECONFORM_VERSION}"
HELM_UNITTEST_DIR="${CACHE}/helm-unittest-${HELM_UNITTEST_VERSION}-helm-${HELM_VERSION}"
KIND_DIR="${CACHE}/kind-${KIND_VERSION}"
# The local cluster tier (hack/cluster.sh): Kubernetes binaries of one release, etcd, kwok, CoreDNS, a pause image.
K8S_BIN_DIR="${CACHE}/kubernetes-${KUBERNETES_VERSION}"
K8S_COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
ETCD_DIR="${CACHE}/etcd-${ETCD_VERSION}"
KWOK_DIR="${CACHE}/kwok-${KWOK_VERSION}"
# The CoreDNS plugins built in (build_coredns): the directives of node.sh's Corefile (tests/unit/test_tools_cache.py
# keeps the two equal). A folder cached before holds upstream's build with every plugin: it serves the same Corefile.
COREDNS_PLUGINS=(bind errors health ready kubernetes cache loadbalance)
COREDNS_DIR="${CACHE}/coredns-${COREDNS_VERSION}"
PAUSE_DIR="${CACHE}/pause-${KUBERNETES_VERSION}"
PROMETHEUS_K8S_DIR="${CACHE}/prometheus-k8s-${PROMETHEUS_K8S_VERSION}"
# The KubeRay CRDs and operator: the ray-operator module of KUBERAY_VERSION.
KUBERAY_DIR="${CACHE}/kuberay-${KUBERAY_VERSION}"
PROMOP_DIR="${CACHE}/prometheus-operator-${PROMETHEUS_OPERATOR_VERSION}"
# Kueue (job queueing): its CRDs + schemas (chart validation) and manager ClusterRole; the manager binary (cluster tier).
KUEUE_DIR="${CACHE}/kueue-${KUEUE_VERSION}"
K8S_SCHEMA_DIR="${CACHE}/kubernetes-validate-${KUBERNETES_VALIDATE_VERSION}"
# Our own small checker (hack/pod-security-check) over the upstream policy code: keyed by its source too.
PSA_SRC="${ROOT}/hack/pod-security-check"
PSA_DIR="${CACHE}/pod-security-check-${PSA_VERSION}-$(cat "${PSA_SRC}/main.go" | sha256sum | cut -c1-12)"
# Python with pyyaml, for kubeconform's openapi2jsonschema.py (the repo venv by default).
PYTHON="${PYTHON:-${ROOT}/.venv/bin/python}"

# The Go toolchain's usual home, for shells whose PATH lacks it (e.g. a CI runner's).
command -v go >/dev/null 2>&1 || { [[ -x /usr/local/go/bin/go ]] && PATH="${PATH}:/usr/local/go/bin"; }
# Go's module and build caches for these builds are ours (not the user's ~/go and ~/.cache/go-build), and are
# removed once a run has built everything it was asked for (prune_go_caches): the binaries are cached by version
# above, while the caches reach ~12 GB (Kubernetes, Helm, Prometheus sources and objects) that a machine running the
# cluster tier needs for images. A version bump downloads and builds afresh. RLP_KEEP_GO_CACHE=1 keeps them.
GO_CACHE_ROOT="${RLP_CACHE:-${HOME}/.cache/rl-platform}/go"
export GOMODCACHE="${GO_CACHE_ROOT}/mod" GOCACHE="${GO_CACHE_ROOT}/build"
# No DWARF from the compiler: every binary here is linked without debug information (-ldflags -s -w) anyway, and the
# compiler's DWARF generation was 11 % of a build's CPU (CoreDNS with its plugins: 130.6 vs 147.2 CPU-s), which on a
# cold 2-core machine is time the test suites beside the builds do not get.
export GOFLAGS="${GOFLAGS:+${GOFLAGS} }-gcflags=all=-dwarf=false"

log() { printf '[tools] %s\n' "$*" >&2; }
need() { command -v "$1" >/dev/null 2>&1 || { echo "tools.sh: '$1' is required ($2)" >&2; exit 2; }; }

# stage DIR: make a fresh temporary sibling of DIR in $T; `publish` renames it to DIR once complete.
# A failed or interrupted build leaves nothing behind: the EXIT trap removes unpublished temporary folders.
STAGED=()
cleanup() { local d; for d in "${STAGED[@]+"${STAGED[@]}"}"; do [[ -e "${d}" ]] && chmod -R u+w "${d}" && rm -rf "${d}"; done; return 0; }
trap cleanup EXIT
stage() { mkdir -p "${CACHE}"; T="$(mktemp -d "$1.tmp.XXXXXX")"; STAGED+=("${T}"); }  # sets T
# Callers build only when DIR lacks their product (checked under the phase's lock), so a DIR that already exists is
# missing it: a folder emptied or left incomplete (a killed run, an older layout; once a helm folder without its bin/
# kept every later run rebuilding helm and throwing it away). Its entries are replaced by TMP's; other entries stay
# (KubeRay's and Kueue's folders also hold the cluster phase's bin/).
publish() { # publish TMP DIR
  if [[ ! -e "$2" ]]; then mv "$1" "$2"; return 0; fi
  log "replacing the incomplete ${2#"${CACHE}/"}"
  local e
  while IFS= read -r -d '' e; do
    [[ -e "$2/${e##*/}" ]] && { chmod -R u+w "$2/${e##*/}"; rm -rf "${2:?}/${e##*/}"; }
    mv "${e}" "$2/"
  done < <(find "$1" -mindepth 1 -maxdepth 1 -print0)
  rm -rf "$1"
}

moddir() { # moddir MODULE@VERSION -> extracted module folder in the Go module cache
  go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p'
}
modfile() { # modfile MODULE@VERSION -> that version's go.mod in the Go module cache
  go mod download -json "$1" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p'
}
go_directive() { sed -n 's/^go \(.*\)$/\1/p' "$1"; } # go_directive GO_MOD -> its `go` version

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

# go_install DIR BINARY MODULE@VERSION: a plain `go install` of one command into DIR/bin (kept when it exists).
go_install() {
  [[ -x "$1/bin/$2" ]] && return 0
  need go "Go toolchain"
  log "building $2 ${3##*@}"
  local t; stage "$1"; t="${T}"
  GOBIN="${t}/bin" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "$3"
  publish "${t}" "$1"
}

build_kind() { go_install "${KIND_DIR}" kind "sigs.k8s.io/kind@v${KIND_VERSION}"; }

# convert_crds SRC_GLOB... -> JSON schemas named {kind}_{version}.json in ./ (run inside the target folder)
convert_crds() {
  [[ -x "${PYTHON}" ]] || PYTHON="$(command -v python3)"
  "${PYTHON}" -c 'import yaml' 2>/dev/null || { echo "tools.sh: ${PYTHON} lacks pyyaml (needed by openapi2jsonschema.py)" >&2; exit 2; }
  FILENAME_FORMAT='{kind}_{version}' "${PYTHON}" "${KUBECONFORM_DIR}/share/openapi2jsonschema.py" "$@" >/dev/null
}

fetch_kuberay() {
  [[ -d "${KUBERAY_DIR}/schemas" && -d "${KUBERAY_DIR}/crds" ]] && return 0
  need go "Go toolchain"; build_kubeconform
  log "fetching KubeRay v${KUBERAY_VERSION} CRDs from github.com/ray-project/kuberay/ray-operator"
  local src t
  src="$(moddir "github.com/ray-project/kuberay/ray-operator@v${KUBERAY_VERSION}")" && [[ -n "${src}" ]] ||
    { echo "tools.sh: github.com/ray-project/kuberay/ray-operator@v${KUBERAY_VERSION} could not be downloaded from $(go env GOPROXY)" >&2; exit 2; }
  stage "${KUBERAY_DIR}"; t="${T}"
  mkdir -p "${t}/crds" "${t}/schemas"
  cp "${src}"/config/crd/bases/ray.io_*.yaml "${t}/crds/"
  chmod -R u+w "${t}/crds"
  echo "${KUBERAY_VERSION}" > "${t}/VERSION"
  (cd "${t}/schemas" && convert_crds "${t}"/crds/*.yaml)
  publish "${t}" "${KUBERAY_DIR}"
}

# Kueue's CRDs (kueue.x-k8s.io: ClusterQueue, LocalQueue, ResourceFlavor, WorkloadPriorityClass, Workload, ...) and
# the manager's ClusterRole, from the sigs.k8s.io/kueue module (its go.mod has no replace: `go install` builds it).
fetch_kueue() {
  [[ -d "${KUEUE_DIR}/schemas" && -d "${KUEUE_DIR}/crds" && -s "${KUEUE_DIR}/rbac/manager_secrets_role.yaml" ]] && return 0
  need go "Go toolchain"; build_kubeconform
  log "fetching Kueue v${KUEUE_VERSION} CRDs from sigs.k8s.io/kueue"
  local src t
  src="$(moddir "sigs.k8s.io/kueue@v${KUEUE_VERSION}")" && [[ -n "${src}" ]] ||
    { echo "tools.sh: sigs.k8s.io/kueue@v${KUEUE_VERSION} could not be downloaded from $(go env GOPROXY)" >&2; exit 2; }
  stage "${KUEUE_DIR}"; t="${T}"
  mkdir -p "${t}/crds" "${t}/schemas" "${t}/rbac"
  cp "${src}"/config/components/crd/bases/kueue.x-k8s.io_*.yaml "${t}/crds/"
  cp "${src}/config/components/rbac/role.yaml" "${src}/config/components/rbac/manager_secrets_role.yaml" "${t}/rbac/"
  chmod -R u+w "${t}/crds" "${t}/rbac"
  echo "${KUEUE_VERSION}" > "${t}/VERSION"
  (cd "${t}/schemas" && convert_crds "${t}"/crds/*.yaml)
  publish "${t}" "${KUEUE_DIR}"
}

build_kueue() {
  fetch_kueue
  [[ -x "${KUEUE_DIR}/bin/kueue" ]] && return 0
  log "building the Kueue v${KUEUE_VERSION} manager"
  rm -rf "${KUEUE_DIR}/bin.tmp"
  GOBIN="${KUEUE_DIR}/bin.tmp" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kueue/cmd/kueue@v${KUEUE_VERSION}"
  mv "${KUEUE_DIR}/bin.tmp" "${KUEUE_DIR}/bin"
}

# The operator binary of the same KubeRay version, for running it outside a cluster (optional; the in-cluster
# operator comes from the upstream kuberay-operator chart/image of the same version).
build_kuberay_operator() {
  fetch_kuberay
  [[ -x "${KUBERAY_DIR}/bin/ray-operator" ]] && return 0
  local v="${KUBERAY_VERSION}"
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

# The Prometheus server of the same Debian package (the live monitoring test, `make monitor`), in its own folder so
# a cached promtool-only folder stays valid: prometheus-<package version>/bin/{prometheus,promtool}.
prometheus_dir() { local d; d="$(promtool_dir || true)"; [[ -n "${d}" ]] && printf '%s/prometheus-%s' "${CACHE}" "${d##*/promtool-}"; }
fetch_prometheus() {
  fetch_promtool
  local dir; dir="$(prometheus_dir || true)"
  [[ -n "${dir}" ]] || { log "WARNING: no Debian prometheus package visible to apt: prometheus not fetched"; return 0; }
  [[ -x "${dir}/bin/prometheus" ]] && return 0
  log "fetching the Prometheus server from Debian package prometheus (${dir##*/prometheus-})"
  local t; stage "${dir}"; t="${T}"
  (cd "${t}" && apt-get download -qq "prometheus=${dir##*/prometheus-}" 2>/dev/null && dpkg-deb -x prometheus_*.deb root)
  mkdir -p "${t}/bin" && mv "${t}/root/usr/bin/prometheus" "${t}/root/usr/bin/promtool" "${t}/bin/"
  rm -rf "${t}/root" "${t}"/prometheus_*.deb
  publish "${t}" "${dir}"
}

# wrapper_module DIR MODULE_PATH GO_VERSION: an empty main module in DIR to resolve and build upstream commands that
# `go install mod@v` refuses (their go.mod has replace directives). Callers append require/replace lines.
wrapper_module() {
  mkdir -p "$1"
  printf 'module %s\n\ngo %s\n' "$2" "$3" > "$1/go.mod"
}

# Kubernetes: k8s.io/kubernetes requires its 31 staging modules at v0.0.0 and replaces them with ./staging/src
# folders; as a dependency those replaces are ignored, so the wrapper repeats them with the published k8s.io/X
# modules of the same release. The version ldflags are the ones hack/lib/version.sh sets: without them /version
# says v0.0.0-master and helm's kubeVersion check fails.
build_kubernetes() {
  local c ok=1
  for c in "${K8S_COMPONENTS[@]}"; do [[ -x "${K8S_BIN_DIR}/bin/${c}" ]] || ok=0; done
  [[ "${ok}" == 1 ]] && return 0
  need go "Go toolchain"
  log "building Kubernetes v${KUBERNETES_VERSION}: ${K8S_COMPONENTS[*]} (cold: 15-25 min on 2 cores)"
  local t kmod w minor="${KUBERNETES_VERSION#*.}"; minor="${minor%%.*}"
  stage "${K8S_BIN_DIR}"; t="${T}"; w="${t}/wrapper"
  kmod="$(modfile "k8s.io/kubernetes@v${KUBERNETES_VERSION}")"
  wrapper_module "${w}" rlplatform.local/tools/kubernetes "$(go_directive "${kmod}")"
  {
    grep '^godebug ' "${kmod}" || true
    echo "require k8s.io/kubernetes v${KUBERNETES_VERSION}"
    sed -n 's#^[[:space:]]*\(k8s.io/[^[:space:]]*\) => ./staging/.*#replace \1 => \1 v0.'"${KUBERNETES_VERSION#*.}"'#p' "${kmod}"
  } >> "${w}/go.mod"
  local pkgs=(); for c in "${K8S_COMPONENTS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/${c}"); done
  (cd "${w}" && go get "${pkgs[@]/%/@v${KUBERNETES_VERSION}}" 2>&1 | grep -v '^go: \(downloading\|added\|upgraded\)' >&2 || true)
  local lf="-s -w" key val
  for kv in "gitVersion=v${KUBERNETES_VERSION}" gitMajor=1 "gitMinor=${minor}" gitTreeState=clean \
            "buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; do
    key="${kv%%=*}"; val="${kv#*=}"
    lf+=" -X k8s.io/client-go/pkg/version.${key}=${val} -X k8s.io/component-base/version.${key}=${val}"
  done
  mkdir -p "${t}/bin"
  (cd "${w}" && CGO_ENABLED=0 go build -trimpath -ldflags "${lf}" -o "${t}/bin/" "${pkgs[@]}")
  rm -rf "${w}"
  publish "${t}" "${K8S_BIN_DIR}"
}

# etcd: its server module's own replaces are ignored as a dependency, which is fine for the server binary.
build_etcd() {
  [[ -x "${ETCD_DIR}/bin/etcd" ]] && return 0
  need go "Go toolchain"
  log "building etcd v${ETCD_VERSION}"
  local t w; stage "${ETCD_DIR}"; t="${T}"; w="${t}/wrapper"
  wrapper_module "${w}" rlplatform.local/tools/etcd 1.24
  (cd "${w}" && go get "go.etcd.io/etcd/server/v3@v${ETCD_VERSION}" 2>&1 | grep -v '^go: \(downloading\|added\|upgraded\)' >&2 || true)
  mkdir -p "${t}/bin"
  (cd "${w}" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "${t}/bin/etcd" go.etcd.io/etcd/server/v3)
  rm -rf "${w}"
  publish "${t}" "${ETCD_DIR}"
}

# kwok: the fake kubelet that runs the GPU (and scale-test) nodes, with the module's own "fast" stages (nodes Ready
# at once, pods Running/Ready at once, Job pods Completed, deletions honoured) as one config file, stages.yaml.
build_kwok() {
  [[ -x "${KWOK_DIR}/bin/kwok" && -s "${KWOK_DIR}/stages.yaml" ]] && return 0
  need go "Go toolchain"
  log "building kwok v${KWOK_VERSION}"
  local t src f; stage "${KWOK_DIR}"; t="${T}"
  GOBIN="${t}/bin" CGO_ENABLED=0 go install -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=v${KWOK_VERSION}" "sigs.k8s.io/kwok/cmd/kwok@v${KWOK_VERSION}"
  src="$(moddir "sigs.k8s.io/kwok@v${KWOK_VERSION}")/kustomize/stage"
  for f in node/fast/node-initialize.yaml pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo "---"; cat "${src}/${f}"
  done > "${t}/stages.yaml"
  rm -rf "${KWOK_DIR}"  # an older folder without stages.yaml
  publish "${t}" "${KWOK_DIR}"
}

# CoreDNS: cluster DNS (K8sJobMode RayJobs resolve the head Service by name). Run on the host, no forwarder.
# Built with only the plugins node.sh's Corefile uses (COREDNS_PLUGINS above), CoreDNS's documented way of choosing
# plugins without `go generate`: a main that imports them and calls coremain.Run. The upstream binary links all ~60
# (route53, azure, clouddns, etcd, dnstap, tracing SDKs ...), which made it one of the tier's longest builds on a
# cold machine. A Corefile naming a plugin outside the list fails at start with "Unknown directive".
build_coredns() {
  [[ -x "${COREDNS_DIR}/bin/coredns" ]] && return 0
  need go "Go toolchain"
  log "building coredns v${COREDNS_VERSION} with plugins: ${COREDNS_PLUGINS[*]}"
  local t w p; stage "${COREDNS_DIR}"; t="${T}"; w="${t}/wrapper"
  wrapper_module "${w}" rlplatform.local/tools/coredns \
    "$(go_directive "$(modfile "github.com/coredns/coredns@v${COREDNS_VERSION}")")"
  {
    printf 'package main\n\nimport (\n\t"github.com/coredns/coredns/coremain"\n'
    for p in "${COREDNS_PLUGINS[@]}"; do printf '\t_ "github.com/coredns/coredns/plugin/%s"\n' "${p}"; done
    printf ')\n\nfunc main() { coremain.Run() }\n'
  } > "${w}/main.go"
  echo "require github.com/coredns/coredns v${COREDNS_VERSION}" >> "${w}/go.mod"
  # tidy resolves only what the chosen plugins import (a `go get` of the module would download every plugin's SDKs)
  (cd "${w}" && go mod tidy 2>&1 | grep -v '^go: \(downloading\|finding\|found\)' >&2 || true)
  mkdir -p "${t}/bin"
  (cd "${w}" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "${t}/bin/coredns" .)
  rm -rf "${w}"
  publish "${t}" "${COREDNS_DIR}"
}

# The pod sandbox ("pause") image: pause.c from the same Kubernetes release, static, as an OCI image tarball
# (docker-archive layout, importable by `ctr images import`) built without Docker or any registry.
build_pause() {
  [[ -f "${PAUSE_DIR}/pause.tar" ]] && return 0
  need cc "a C compiler (gcc)"
  log "building the pause image from k8s.io/kubernetes@v${KUBERNETES_VERSION} build/pause/linux/pause.c"
  local t src; stage "${PAUSE_DIR}"; t="${T}"
  src="$(moddir "k8s.io/kubernetes@v${KUBERNETES_VERSION}")"
  mkdir -p "${t}/rootfs"
  cc -Os -Wall -Werror -static -DVERSION="v${KUBERNETES_VERSION}-rl-platform" -o "${t}/rootfs/pause" "${src}/build/pause/linux/pause.c"
  strip "${t}/rootfs/pause" 2>/dev/null || true
  "${PYTHON_SYS:-python3}" "${ROOT}/hack/cluster/oci-image.py" --rootfs "${t}/rootfs" --entrypoint /pause \
    --user 65535:65535 --tag "registry.k8s.io/pause:rl-platform-${KUBERNETES_VERSION}" --out "${t}/pause.tar"
  rm -rf "${t}/rootfs"
  publish "${t}" "${PAUSE_DIR}"
}

# The upstream Prometheus server and promtool with kubernetes_sd (the cluster tier scrapes the chart's PodMonitors
# with the config hack/promconfig.py generates from them). Release 3.M.P is Go module v0.<3*100+M>.P; its go.mod has no
# replace directives, so a plain `go install` builds it. Build tags as upstream's .promu.yml minus `builtinassets`
# (no web UI: the HTTP API is all a test queries), plus plugins/'s `remove_all_sd enable_kubernetes_sd` so only the
# kubernetes (and the always-built file/http) discovery is linked. Version ldflags as upstream's, so `--version` and
# /api/v1/status/buildinfo say which release runs; the module proxy gives no commit, so revision is the module version.
build_prometheus_k8s() {
  [[ -x "${PROMETHEUS_K8S_DIR}/bin/prometheus" && -x "${PROMETHEUS_K8S_DIR}/bin/promtool" ]] && return 0
  need go "Go toolchain"
  local v="${PROMETHEUS_K8S_VERSION}" major minor patch t
  IFS=. read -r major minor patch <<<"${v}"
  local mv="v0.$((major * 100 + minor)).${patch}" pkg="github.com/prometheus/prometheus/cmd"
  log "building prometheus + promtool ${v} (module ${mv}) with kubernetes_sd only"
  stage "${PROMETHEUS_K8S_DIR}"; t="${T}"
  local lf="-s -w" cv="github.com/prometheus/common/version"
  lf+=" -X ${cv}.Version=${v} -X ${cv}.Revision=${mv} -X ${cv}.Branch=HEAD"
  lf+=" -X ${cv}.BuildUser=rl-platform@hack/tools.sh -X ${cv}.BuildDate=$(date -u +%Y%m%d-%H:%M:%S)"
  GOBIN="${t}/bin" CGO_ENABLED=0 go install -trimpath -tags "netgo remove_all_sd enable_kubernetes_sd" -ldflags "${lf}" \
    "${pkg}/prometheus@${mv}" "${pkg}/promtool@${mv}"
  publish "${t}" "${PROMETHEUS_K8S_DIR}"
}

# The cluster phase in three parts, each under its own lock, so that Level A (a control plane with KWOK nodes) can
# start while what only Level B's real node needs is still being built (make test's cold layout, Makefile
# TEST_LAYOUT), and Level B while the Prometheus only its PodMonitor test uses is: cluster-a: etcd, Kubernetes, kwok,
# the KubeRay operator, Kueue; cluster-b: CoreDNS, the pause image; prometheus-k8s. The independent builds side by
# side.
cluster_a_tools() {
  # kubeconform first (it converts the CRDs to schemas): the operator's and Kueue's fetches, side by side below, would
  # each build it (seen: twice in one cold run).
  build_etcd & local p1=$!
  build_kwok & local p2=$!
  build_kubeconform & local p3=$!
  wait "${p1}" && wait "${p2}" && wait "${p3}" || exit 1
  timed build_kubernetes
  build_kuberay_operator & p1=$!
  timed build_kueue & p2=$!
  wait "${p1}" && wait "${p2}" || exit 1
}

cluster_b_tools() {
  build_coredns & local p1=$!
  build_pause & local p2=$!
  wait "${p1}" && wait "${p2}" || exit 1
}

print_env() {
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
PROMETHEUS=$(d="$(prometheus_dir || true)"; [[ -n "${d}" ]] && echo "${d}/bin/prometheus")
KUBE_VERSION=${KUBE_VERSION}
KUBERNETES_VERSION=${KUBERNETES_VERSION}
K8S_BIN=${K8S_BIN_DIR}/bin
ETCD=${ETCD_DIR}/bin/etcd
KWOK=${KWOK_DIR}/bin/kwok
KWOK_STAGES=${KWOK_DIR}/stages.yaml
COREDNS=${COREDNS_DIR}/bin/coredns
PAUSE_IMAGE_TAR=${PAUSE_DIR}/pause.tar
PAUSE_IMAGE=registry.k8s.io/pause:rl-platform-${KUBERNETES_VERSION}
KUBERAY_OPERATOR=${KUBERAY_DIR}/bin/ray-operator
PROMETHEUS_K8S=${PROMETHEUS_K8S_DIR}/bin/prometheus
PROMTOOL_K8S=${PROMETHEUS_K8S_DIR}/bin/promtool
PROMETHEUS_K8S_VERSION=${PROMETHEUS_K8S_VERSION}
KUEUE_VERSION=${KUEUE_VERSION}
KUEUE_CRDS=${KUEUE_DIR}/crds
KUEUE_SCHEMAS=${KUEUE_DIR}/schemas
KUEUE_RBAC=${KUEUE_DIR}/rbac
KUEUE=${KUEUE_DIR}/bin/kueue
EOF
}

timed() { local s=$SECONDS; "$@"; log "$1 done in $((SECONDS - s))s"; }

# Locks (flock(1), util-linux): ${CACHE}/.lock-<phase> serialises builders of one phase; every builder holds
# ${CACHE}/.lock-go shared for its whole run, and the prune needs it exclusive (taken without waiting: a run that
# cannot take it leaves the caches to the run still using them, which prunes when it ends).
hold_go_lock() { mkdir -p "${CACHE}"; exec {GO_LOCK_FD}>"${CACHE}/.lock-go"; flock -s "${GO_LOCK_FD}"; }
with_lock() { # with_lock PHASE CMD...: run CMD holding the phase's lock, saying so when another run holds it
  local fd rc=0
  mkdir -p "${CACHE}"; exec {fd}>"${CACHE}/.lock-$1"
  if ! flock -n "${fd}"; then
    log "waiting for another hack/tools.sh run building the '$1' tools"
    "${ROOT}/hack/background.sh" boost
    flock "${fd}"
  fi
  shift; "$@" || rc=$?
  exec {fd}>&-
  return "${rc}"
}

prune_go_caches() {
  [[ "${RLP_KEEP_GO_CACHE:-0}" != 1 && -d "${GO_CACHE_ROOT}" ]] || return 0
  if ! flock -n -x "${GO_LOCK_FD}"; then  # held by hold_go_lock (main)
    log "another hack/tools.sh run is using Go's caches: it prunes them when it ends"; return 0
  fi
  local size; size="$(du -sh "${GO_CACHE_ROOT}" 2>/dev/null | cut -f1)"
  go clean -cache -modcache 2>/dev/null || true
  chmod -R u+w "${GO_CACHE_ROOT}" 2>/dev/null || true
  rm -rf "${GO_CACHE_ROOT}"
  log "removed Go's caches of these builds (${size}; RLP_KEEP_GO_CACHE=1 keeps them)"
}

all_tools() {
  timed build_kubeconform; timed fetch_k8s_schemas; timed fetch_kuberay; timed fetch_kueue; timed fetch_prometheus_operator
  timed build_helm; timed build_helm_unittest; timed build_pod_security_check; timed fetch_promtool
  timed fetch_prometheus
}

TARGETS="all helm kubeconform helm-unittest kind k8s-schemas kuberay kuberay-operator-binary kueue kueue-binary \
prometheus-operator promtool prometheus pod-security-check kubernetes etcd kwok coredns pause cluster cluster-a cluster-b \
prometheus-k8s"

run_target() {
  case "$1" in
    all) with_lock all all_tools ;;
    helm) with_lock all build_helm ;;
    kubeconform) with_lock all build_kubeconform ;;
    helm-unittest) with_lock all build_helm_unittest ;;
    kind) with_lock all build_kind ;;
    k8s-schemas) with_lock all fetch_k8s_schemas ;;
    kuberay) with_lock all fetch_kuberay ;;
    kuberay-operator-binary) with_lock cluster build_kuberay_operator ;;
    kueue) with_lock all fetch_kueue ;;
    kueue-binary) with_lock cluster build_kueue ;;
    prometheus-operator) with_lock all fetch_prometheus_operator ;;
    promtool) with_lock all fetch_promtool ;;
    prometheus) with_lock all fetch_prometheus ;;
    pod-security-check) with_lock all build_pod_security_check ;;
    kubernetes) with_lock cluster build_kubernetes ;;
    etcd) with_lock cluster build_etcd ;;
    kwok) with_lock cluster build_kwok ;;
    coredns) with_lock cluster-b build_coredns ;;
    pause) with_lock cluster-b build_pause ;;
    prometheus-k8s) with_lock prometheus-k8s timed build_prometheus_k8s ;;
    cluster-a) with_lock cluster timed cluster_a_tools ;;
    cluster-b) with_lock cluster-b timed cluster_b_tools ;;
    cluster) run_target cluster-a && run_target cluster-b && run_target prometheus-k8s ;;
    *) echo "usage: $0 [${TARGETS// /|}]... | env" >&2; exit 2 ;;
  esac
}

# `built cluster`: exit 0 when every product of the cluster phase is in the cache (nothing to compile), else 1.
# `make test` lays its suites out by it (Makefile TEST_LAYOUT): cached, or cold (the cluster tier beside the Python
# suites, waiting for the background run to build this phase).
cluster_built() {
  local env; env="$(print_env)"
  local k v
  for k in ETCD KWOK COREDNS PAUSE_IMAGE_TAR KUBERAY_OPERATOR PROMETHEUS_K8S KUEUE; do
    v="$(sed -n "s/^${k}=//p" <<<"${env}")"; [[ -n "${v}" && -e "${v}" ]] || return 1
  done
  v="$(sed -n 's/^K8S_BIN=//p' <<<"${env}")"
  for k in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy; do
    [[ -x "${v}/${k}" ]] || return 1
  done
}

main() {
  (($#)) || set -- all
  [[ "$1" == env ]] && { print_env; return 0; }
  [[ "$1" == built && "${2:-}" == cluster ]] && { cluster_built; return $?; }
  local t
  for t in "$@"; do  # every target known before anything is built
    [[ "${t}" != env && " ${TARGETS} " == *" ${t} "* ]] || run_target usage
  done
  hold_go_lock
  for t in "$@"; do run_target "${t}"; done
  prune_go_caches
}

# One line, parsed whole before it runs: editing this file while it runs cannot change what it does.
{ main "$@"; exit $?; }
