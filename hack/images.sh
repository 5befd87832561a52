#!/usr/bin/env bash
# Build rl-platform's container images (Dockerfile.cpu / Dockerfile.gpu, and docker/redis.Dockerfile: Debian's
# redis-server 7.0 for Ray's GCS fault tolerance) with a local Docker engine, without any container registry:
#   * starts `dockerd` when no engine answers (Debian docker.io; CI machines start with none running);
#   * creates the base image (debian:bookworm-slim by default) with debootstrap -> `docker import` under the same
#     tag when it is not present and cannot be pulled; the rootfs tar is cached per release/arch;
#   * fills a host-side wheelhouse (pip wheel, once per dependency set) and serves it to the build on
#     127.0.0.1 (`docker build --network host`), so a rebuild never downloads the ~2.9 GB of wheels again;
#   * stages an extra CA bundle for pip inside the build (TLS-intercepting proxies) into the gitignored
#     docker/certs/ only for builds that reach a package index, and removes it afterwards. It is used by the
#     builder stage only and never reaches the final image.
#
# Usage: hack/images.sh [COMMAND] [cpu|gpu|redis ...]
#   build [cpu|gpu|redis...]  build the images (default: cpu)          (make images / images-gpu / images-redis)
#   dockerd              make sure a Docker engine answers (start dockerd if needed)
#   base                 make sure the base image exists (pull, else debootstrap -> docker import)
#   wheels [cpu|gpu]     fill the host wheelhouse for the image's dependency set
#   pipcheck             prove pip inside a build reaches the index through the staged CA bundle
#   kind-load [cpu|gpu]  load the images into a kind cluster, when kind and a cluster exist (default: the CPU
#                        image, and the GPU image when it is built)
#   report [cpu|gpu]     print image sizes and the largest layers
#   tag [cpu|gpu]        print the image tag (used by the tests and mk/images.mk)
#
# Environment (all optional):
#   RLP_CACHE            cache root (default ~/.cache/rl-platform): base/ rootfs tars, wheels/<key>/ wheelhouses
#   IMAGE_CPU IMAGE_GPU IMAGE_REDIS  tags (default: those of mk/versions.mk; the version part of the tag also
#                        becomes the image's org.opencontainers.image.version label)
#   BASE_IMAGE           base image tag (default debian:bookworm-slim); created locally when missing
#   DEBIAN_RELEASE       debootstrap suite for a locally made base (default bookworm; must give Python 3.11)
#   DEBIAN_MIRROR        debootstrap mirror (default: this machine's apt archive, docker/host_indexes.py)
#   DEBIAN_SECURITY_MIRROR  security archive written into a locally made base (default: this machine's)
#   TORCH_INDEX_URL      index for torch alone (default: the pip index, the CUDA build). For a CPU-only torch in the
#                        CPU image: PyTorch's CPU wheel index (.../whl/cpu, ~2.5 GB smaller)
#   TORCH_INDEX_URL_GPU  the same for the GPU image (default: the pip index)
# Package indexes are never written in this repo: pip's come from this machine's pip configuration
# (PIP_INDEX_URL / PIP_EXTRA_INDEX_URL or `pip config`) and are passed to the builds as PKG_INDEX_URL /
# PKG_EXTRA_INDEX_URL; apt's from /etc/apt (docker/host_indexes.py prints what it found).
#   RLP_WHEELHOUSE       1 (default): install from the host wheelhouse; 0: pip inside the build uses the index
#   RLP_WHEELHOUSE_PORT  loopback port the wheelhouse is served on during a build (default 38517)
#   RLP_CA_BUNDLE        PEM bundle pip inside the build must trust (default: $PIP_CERT, else the host's
#                        /etc/ssl/certs/ca-certificates.crt when present; "none" disables)
#   PYTHON               Python 3.11 with pip used to fill the wheelhouse (default .venv/bin/python, else python3)
#   DOCKER               docker client (default: docker on PATH)
#   KIND / KIND_CLUSTER  kind binary and cluster name (default: kind on PATH or built by hack/tools.sh;
#                        "rl-platform", the cluster `make deploy-cluster` creates)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
# shellcheck source=hack/cluster/common.sh
source "${ROOT}/hack/cluster/common.sh" # DOCKER_BRIDGE_IP, DOCKER_ADDRESS_POOL: the engine's addresses

CACHE="${RLP_CACHE:-${HOME}/.cache/rl-platform}"
DOCKER="${DOCKER:-docker}"
BASE_IMAGE="${BASE_IMAGE:-debian:bookworm-slim}"
DEBIAN_RELEASE="${DEBIAN_RELEASE:-bookworm}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-}"
DEBIAN_SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-}"
WHEELHOUSE_PORT="${RLP_WHEELHOUSE_PORT:-38517}"
USE_WHEELHOUSE="${RLP_WHEELHOUSE:-1}"
PIPCHECK_IMAGE="${PIPCHECK_IMAGE:-rl-platform-pipcheck:latest}"
CERT_DIR="${ROOT}/docker/certs"
STAGED_CA="${CERT_DIR}/extra-ca.crt"
# The legacy builder: Debian docker.io 20.10 has no buildx, and a newer client without the buildx plugin
# refuses BuildKit. Nothing here needs BuildKit (no secret mounts: the CA stays in a builder stage).
export DOCKER_BUILDKIT=0

log() { printf '[images] %s\n' "$*" >&2; }
die() { printf 'images.sh: %s\n' "$*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "'$1' is required ($2)"; }

mkvar() { # mkvar NAME -> value of `NAME := value` in mk/versions.mk (empty when absent)
  [[ -f mk/versions.mk ]] || return 0
  sed -n "s/^$1[[:space:]]*[:?]\{0,1\}=[[:space:]]*\(.*[^[:space:]]\)[[:space:]]*$/\1/p" mk/versions.mk | tail -n1
}
IMAGE_CPU="${IMAGE_CPU:-$(mkvar IMAGE_CPU)}"
IMAGE_GPU="${IMAGE_GPU:-$(mkvar IMAGE_GPU)}"
IMAGE_REDIS="${IMAGE_REDIS:-$(mkvar IMAGE_REDIS)}"

# This machine's package indexes (docker/host_indexes.py), read once: HOST_PKG_INDEX_URL, HOST_PKG_EXTRA_INDEX_URL,
# HOST_APT_MIRROR, HOST_APT_SECURITY_MIRROR (empty when unset here).
HOST_INDEXES_LOADED=0
load_host_indexes() {
  ((HOST_INDEXES_LOADED)) && return 0
  local py="${PYTHON:-}" line
  if [[ -z "${py}" ]]; then
    if [[ -x "${ROOT}/.venv/bin/python" ]]; then py="${ROOT}/.venv/bin/python"; else py="python3"; fi
  fi
  HOST_PKG_INDEX_URL="" HOST_PKG_EXTRA_INDEX_URL="" HOST_APT_MIRROR="" HOST_APT_SECURITY_MIRROR=""
  while IFS= read -r line; do
    case "${line}" in
      PKG_INDEX_URL=* | PKG_EXTRA_INDEX_URL=* | APT_MIRROR=* | APT_SECURITY_MIRROR=*)
        printf -v "HOST_${line%%=*}" '%s' "${line#*=}" ;;
    esac
  done < <(python3 "${ROOT}/docker/host_indexes.py" --pip "${py}")
  HOST_INDEXES_LOADED=1
}
# --build-arg flags handing this machine's pip indexes to a build, one word per line.
pip_index_args() {
  load_host_indexes
  if [[ -n "${HOST_PKG_INDEX_URL}" ]]; then echo "--build-arg"; echo "PKG_INDEX_URL=${HOST_PKG_INDEX_URL}"; fi
  if [[ -n "${HOST_PKG_EXTRA_INDEX_URL}" ]]; then echo "--build-arg"; echo "PKG_EXTRA_INDEX_URL=${HOST_PKG_EXTRA_INDEX_URL}"; fi
}

image_of() {
  local image
  case "$1" in
    cpu) image="${IMAGE_CPU}" ;; gpu) image="${IMAGE_GPU}" ;; redis) image="${IMAGE_REDIS}" ;;
    *) die "unknown flavour '$1' (cpu|gpu|redis)" ;;
  esac
  [[ -n "${image}" ]] || die "no tag for the $1 image: mk/versions.mk has no IMAGE_${1^^} (or set IMAGE_${1^^})"
  echo "${image}"
}
image_version() { local tag="${1##*:}"; echo "${tag%-*}"; } # <repo>:<version>-<flavour> -> <version>
torch_index_of() { case "$1" in cpu) echo "${TORCH_INDEX_URL:-}" ;; gpu) echo "${TORCH_INDEX_URL_GPU:-}" ;; esac; }

# ---------------------------------------------------------------------------------------------------- engine
engine_ok() { timeout 20 "${DOCKER}" info >/dev/null 2>&1; }

# A fresh machine has neither the engine nor debootstrap: install Debian's (root only).
ensure_packages() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v "${DOCKER}" >/dev/null 2>&1 || missing+=(docker.io)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  ((${#missing[@]})) || return 0
  [[ "$(id -u)" == 0 ]] || die "missing ${missing[*]}: apt-get install -y ${missing[*]} (needs root)"
  log "installing ${missing[*]} (apt)"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

is_proc() { # is_proc PID NAME: a live (not zombie) process NAME
  [[ -n "$1" && -r "/proc/$1/stat" ]] || return 1
  [[ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]] || return 1
  [[ "$(cat "/proc/$1/comm" 2>/dev/null)" == "$2" ]]
}

wait_engine() { # wait_engine DOCKERD_PID LOG: until the engine answers (0), dockerd exits or 90 s pass (1)
  local deadline=$((SECONDS + 90))
  until engine_ok; do
    is_proc "$1" dockerd || return 1
    ((SECONDS < deadline)) || return 1
    sleep 1
  done
}

ensure_dockerd() {
  if ! engine_ok; then ensure_packages; fi
  need "${DOCKER}" "apt-get install -y docker.io"
  engine_ok && return 0
  need dockerd "apt-get install -y docker.io"
  [[ "$(id -u)" == 0 ]] || die "no Docker engine answers and starting dockerd needs root"
  mkdir -p "${CACHE}"
  local logf="${CACHE}/dockerd.log"
  log "no Docker engine answers: starting dockerd (log: ${logf})"
  # A dockerd that is alive but not answering yet (starting up): wait for it rather than start a second one.
  # Pid files of dead (zombie, recycled) processes make a new dockerd refuse to start or wait for a containerd
  # that is gone: remove them. One retry covers processes of a killed engine that were still exiting.
  local pid="" try
  [[ -r /var/run/docker.pid ]] && pid="$(cat /var/run/docker.pid 2>/dev/null || true)"
  if [[ -n "${pid}" ]] && is_proc "${pid}" dockerd; then
    log "dockerd (pid ${pid}) is running but does not answer yet; waiting"
    wait_engine "${pid}" "${logf}" && return 0
    die "dockerd (pid ${pid}) does not answer (log: ${logf})"
  fi
  for try in 1 2; do
    rm -f /var/run/docker.pid
    local cpid="/var/run/docker/containerd/containerd.pid"
    if [[ -r "${cpid}" ]] && ! is_proc "$(cat "${cpid}" 2>/dev/null)" containerd; then rm -f "${cpid}"; fi
    setsid nohup dockerd --bip "${DOCKER_BRIDGE_IP}" --default-address-pool "${DOCKER_ADDRESS_POOL}" \
      >>"${logf}" 2>&1 </dev/null 9>&- &
    pid=$!
    wait_engine "${pid}" "${logf}" && break
    ((try < 2)) || { tail -n 30 "${logf}" >&2; die "dockerd did not start (log: ${logf})"; }
    log "dockerd did not start; retrying once"
    kill "${pid}" 2>/dev/null || true
    sleep 3
  done
  log "dockerd is up ($("${DOCKER}" version --format '{{.Server.Version}}' 2>/dev/null))"
}

# ---------------------------------------------------------------------------------------------------- base
have_image() { "${DOCKER}" image inspect "$1" >/dev/null 2>&1; }

ensure_base() {
  ensure_dockerd
  if have_image "${BASE_IMAGE}"; then return 0; fi
  if [[ "${RLP_TRY_PULL:-1}" == 1 ]] && timeout 60 "${DOCKER}" pull "${BASE_IMAGE}" >/dev/null 2>&1; then
    log "pulled ${BASE_IMAGE}"
    return 0
  fi
  load_host_indexes
  DEBIAN_MIRROR="${DEBIAN_MIRROR:-${HOST_APT_MIRROR}}"
  DEBIAN_SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-${HOST_APT_SECURITY_MIRROR}}"
  local arch tarball
  arch="$(dpkg --print-architecture 2>/dev/null || echo amd64)"
  tarball="${CACHE}/base/debian-${DEBIAN_RELEASE}-minbase-${arch}.tar"
  if [[ ! -s "${tarball}" ]]; then
    need debootstrap "apt-get install -y debootstrap"
    [[ -n "${DEBIAN_MIRROR}" ]] || die "no Debian archive in this machine's apt sources (/etc/apt): set DEBIAN_MIRROR"
    [[ "$(id -u)" == 0 ]] || die "debootstrap needs root"
    mkdir -p "${CACHE}/base"
    local rootfs
    rootfs="$(mktemp -d "${CACHE}/base/rootfs.XXXXXX")"
    log "debootstrap ${DEBIAN_RELEASE} (minbase) from ${DEBIAN_MIRROR} -> ${tarball}"
    local s=${SECONDS}
    if ! debootstrap --variant=minbase --arch="${arch}" "${DEBIAN_RELEASE}" "${rootfs}" "${DEBIAN_MIRROR}" \
      >"${CACHE}/base/debootstrap.log" 2>&1; then
      tail -n 30 "${CACHE}/base/debootstrap.log" >&2
      rm -rf "${rootfs}"
      die "debootstrap failed"
    fi
    slim_rootfs "${rootfs}"
    tar --numeric-owner -C "${rootfs}" -cf "${tarball}.tmp" .
    mv "${tarball}.tmp" "${tarball}"
    rm -rf "${rootfs}"
    log "base rootfs made in $((SECONDS - s)) s ($(du -h "${tarball}" | cut -f1))"
  fi
  log "docker import ${tarball} as ${BASE_IMAGE}"
  "${DOCKER}" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["bash"]' \
    --message "debootstrap --variant=minbase ${DEBIAN_RELEASE} (rl-platform hack/images.sh)" \
    "${tarball}" "${BASE_IMAGE}" >/dev/null
}

# Make a debootstrap minbase look like the official -slim images: no apt lists/caches, no docs/man/locales now
# or in later `apt-get install`s, no recommends, sources for the release + security updates.
slim_rootfs() {
  local r="$1"
  mkdir -p "${r}/etc/dpkg/dpkg.cfg.d" "${r}/etc/apt/apt.conf.d"
  cat >"${r}/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
  cat >"${r}/etc/apt/apt.conf.d/docker-slim" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
EOF
  if [[ "${DEBIAN_RELEASE}" == bookworm || "${DEBIAN_RELEASE}" == trixie ]]; then
    cat >"${r}/etc/apt/sources.list" <<EOF
deb ${DEBIAN_MIRROR} ${DEBIAN_RELEASE} main
deb ${DEBIAN_MIRROR} ${DEBIAN_RELEASE}-updates main
EOF
    if [[ -n "${DEBIAN_SECURITY_MIRROR}" ]]; then
      echo "deb ${DEBIAN_SECURITY_MIRROR} ${DEBIAN_RELEASE}-security main" >>"${r}/etc/apt/sources.list"
    else
      log "no security archive in this machine's apt sources: the base image gets none (set DEBIAN_SECURITY_MIRROR)"
    fi
  fi
  find "${r}/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
  rm -rf "${r}/usr/share/man/"* "${r}/usr/share/info/"* "${r}/var/lib/apt/lists/"* \
    "${r}/var/cache/apt/"*.bin "${r}/var/cache/apt/archives/"*.deb "${r}/var/log/"*.log "${r}/tmp/"* 2>/dev/null || true
  find "${r}/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} + 2>/dev/null || true
}

# ---------------------------------------------------------------------------------------------------- wheels
host_python() {
  local py="${PYTHON:-}"
  if [[ -z "${py}" ]]; then
    if [[ -x "${ROOT}/.venv/bin/python" ]]; then py="${ROOT}/.venv/bin/python"; else py="python3"; fi
  fi
  "${py}" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' 2>/dev/null ||
    die "the wheelhouse needs a Python 3.11 with pip (the image's Python); set PYTHON="
  "${py}" -m pip --version >/dev/null 2>&1 || die "${py} has no pip"
  echo "${py}"
}

# The dependency list exactly as pyproject.toml pins it (the same script the Dockerfiles run).
deps_file() { "$(host_python)" docker/pyproject_deps.py pyproject.toml; }

wheel_key() { # wheel_key FLAVOUR -> short hash of everything that decides the wheelhouse's contents
  {
    deps_file
    echo "torch-index=$(torch_index_of "$1")"
    load_host_indexes
    echo "pip-index=${HOST_PKG_INDEX_URL} extra=${HOST_PKG_EXTRA_INDEX_URL}"
    echo "python=3.11 platform=$(uname -m) glibc=$(ldd --version 2>/dev/null | head -n1 | awk '{print $NF}')"
    echo "extra=setuptools>=68 wheel"
  } | sha256sum | cut -c1-16
}

ensure_wheels() { # ensure_wheels FLAVOUR -> prints the wheelhouse dir
  local flavour="$1" key dir py idx
  key="$(wheel_key "${flavour}")"
  dir="${CACHE}/wheels/${key}"
  if [[ -f "${dir}/.complete" ]]; then echo "${dir}"; return 0; fi
  py="$(host_python)"
  idx="$(torch_index_of "${flavour}")"
  mkdir -p "${CACHE}/wheels"
  rm -rf "${dir}".tmp.* # left by an interrupted fill (fills run under the lock, one at a time)
  local tmp reqs s=${SECONDS}
  tmp="$(mktemp -d "${dir}.tmp.XXXXXX")"
  reqs="${tmp}/requirements.txt"
  deps_file >"${reqs}"
  log "filling wheelhouse ${dir} (pip wheel; ~2.9 GB the first time)"
  if [[ -n "${idx}" ]]; then
    # torch alone from its index first; its dependencies and everything else then come from this machine's pip
    # index, the torch wheel being found in the wheelhouse (--find-links).
    "${py}" -m pip wheel --quiet --no-deps --wheel-dir "${tmp}" --index-url "${idx}" \
      "$(grep -E '^torch([=<>~! ]|$)' "${reqs}")" >&2
  fi
  "${py}" -m pip wheel --quiet --wheel-dir "${tmp}" --find-links "${tmp}" -r "${reqs}" "setuptools>=68" wheel >&2
  rm -f "${reqs}"
  touch "${tmp}/.complete"
  if [[ -e "${dir}" ]]; then rm -rf "${tmp}"; else mv "${tmp}" "${dir}"; fi
  log "wheelhouse ready in $((SECONDS - s)) s ($(du -sh "${dir}" | cut -f1), $(ls "${dir}" | wc -l) wheels)"
  echo "${dir}"
}

SERVER_PID=""
serve_wheels() { # serve_wheels -> serve ${CACHE}/wheels on 127.0.0.1:PORT for the build
  local py
  py="$(command -v python3)"
  if (echo >"/dev/tcp/127.0.0.1/${WHEELHOUSE_PORT}") 2>/dev/null; then
    die "port ${WHEELHOUSE_PORT} is in use (another build?); set RLP_WHEELHOUSE_PORT"
  fi
  "${py}" -m http.server --bind 127.0.0.1 --directory "${CACHE}/wheels" "${WHEELHOUSE_PORT}" \
    >"${CACHE}/wheelhouse-http.log" 2>&1 &
  SERVER_PID=$!
  local deadline=$((SECONDS + 20))
  until (echo >"/dev/tcp/127.0.0.1/${WHEELHOUSE_PORT}") 2>/dev/null; do
    ((SECONDS < deadline)) || die "wheelhouse server did not start"
    sleep 0.2
  done
}
stop_wheels() { if [[ -n "${SERVER_PID}" ]]; then kill "${SERVER_PID}" 2>/dev/null || true; wait "${SERVER_PID}" 2>/dev/null || true; SERVER_PID=""; fi; }

# ---------------------------------------------------------------------------------------------------- CA
ca_source() {
  local ca="${RLP_CA_BUNDLE:-${PIP_CERT:-}}"
  if [[ -z "${ca}" && -r /etc/ssl/certs/ca-certificates.crt ]]; then ca=/etc/ssl/certs/ca-certificates.crt; fi
  [[ "${ca}" == none ]] && ca=""
  echo "${ca}"
}
stage_ca() {
  local ca
  ca="$(ca_source)"
  [[ -n "${ca}" ]] || return 0
  [[ -r "${ca}" ]] || die "CA bundle ${ca} is not readable"
  install -m 0644 "${ca}" "${STAGED_CA}"
  log "staged CA bundle ${ca} for pip in the builder stage (removed after the build)"
}
unstage_ca() { rm -f "${STAGED_CA}"; }

cleanup() { stop_wheels; unstage_ca; }

# ---------------------------------------------------------------------------------------------------- build
dockerfile_of() { case "$1" in redis) echo docker/redis.Dockerfile ;; *) echo "Dockerfile.$1" ;; esac; }
# Flavours whose build installs Python packages (the wheelhouse, the pip indexes); redis is apt only.
uses_pip() { [[ "$1" != redis ]]; }

build_one() { # build_one FLAVOUR
  local flavour="$1" image dockerfile idx wh_url="" wh_dir s
  image="$(image_of "${flavour}")"
  dockerfile="$(dockerfile_of "${flavour}")"
  idx="$(torch_index_of "${flavour}")"
  local args=(--network host -f "${dockerfile}" -t "${image}" --build-arg "BASE_IMAGE=${BASE_IMAGE}"
    --build-arg "IMAGE_VERSION=$(image_version "${image}")"
    --label "org.opencontainers.image.revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)")
  if [[ -n "${idx}" ]]; then args+=(--build-arg "TORCH_INDEX_URL=${idx}"); fi
  local a
  # The redis image installs Debian packages only: the base image's apt sources (this machine's archives).
  if uses_pip "${flavour}"; then
    while IFS= read -r a; do args+=("${a}"); done < <(pip_index_args)
    if [[ "${USE_WHEELHOUSE}" == 1 ]]; then
      wh_dir="$(ensure_wheels "${flavour}")"
      wh_url="http://127.0.0.1:${WHEELHOUSE_PORT}/$(basename "${wh_dir}")/"
      args+=(--build-arg "WHEELHOUSE_URL=${wh_url}")
      [[ -n "${SERVER_PID}" ]] || serve_wheels
    else
      stage_ca
    fi
  fi
  log "building ${image} from ${dockerfile}${wh_url:+ (wheelhouse ${wh_url})}"
  s=${SECONDS}
  mkdir -p "${CACHE}/logs"
  local blog="${CACHE}/logs/build-${flavour}.log"
  # Every line goes to stderr and to the log.
  set +e
  "${DOCKER}" build --force-rm "${args[@]}" . 2>&1 | tee "${blog}" >&2
  local rc=${PIPESTATUS[0]}
  set -e
  unstage_ca
  ((rc == 0)) || die "docker build of ${image} failed (exit ${rc}); log: ${blog}"
  log "built ${image} in $((SECONDS - s)) s: $(size_of "${image}")"
  # The image this tag named before is now dangling: drop it (only final images carry this label; the
  # dependency stages stay in the build cache).
  "${DOCKER}" image prune -f --filter "label=ai.rl-platform.flavour=${flavour}" >/dev/null 2>&1 || true
}

size_of() { "${DOCKER}" image inspect -f '{{.Size}}' "$1" | awk '{printf "%.2f GB (%.0f bytes)", $1/1e9, $1}'; }

pipcheck() {
  ensure_base
  stage_ca
  log "pipcheck: pip in a builder stage downloads from the index through the staged CA"
  # A fresh nonce: the download must really happen now, not come from the build cache.
  local idx_args=() a
  while IFS= read -r a; do idx_args+=("${a}"); done < <(pip_index_args)
  set +e
  "${DOCKER}" build --force-rm --network host -f docker/pipcheck.Dockerfile --build-arg "BASE_IMAGE=${BASE_IMAGE}" \
    ${idx_args[@]+"${idx_args[@]}"} --build-arg "PIPCHECK_NONCE=$(date +%s%N)" -t "${PIPCHECK_IMAGE}" . >&2
  local rc=$?
  set -e
  unstage_ca
  ((rc == 0)) || die "pipcheck: pip inside the build could not download from the index (exit ${rc})"
  log "pipcheck: ok (${PIPCHECK_IMAGE})"
}

report() {
  local f image
  for f in "$@"; do
    image="$(image_of "${f}")"
    have_image "${image}" || { log "${image}: not built"; continue; }
    echo "== ${image}: $(size_of "${image}")"
    echo "largest layers:"
    "${DOCKER}" history --no-trunc --format '{{.Size}}\t{{.CreatedBy}}' "${image}" |
      awk -F'\t' '{ s=$1; v=s+0; if (s ~ /GB/) v*=1e9; else if (s ~ /MB/) v*=1e6; else if (s ~ /kB/) v*=1e3;
                    c=$2; gsub(/^\/bin\/sh -c (#\(nop\) )?/, "", c); if (c == "") c = "(base image layer)"; printf "%.0f\t%s\t%s\n", v, s, substr(c,1,110) }' |
      sort -rn | head -n 6 | cut -f2-
  done
}

kind_bin() {
  if [[ -n "${KIND:-}" ]]; then echo "${KIND}"; return; fi
  if command -v kind >/dev/null 2>&1; then command -v kind; return; fi
  if [[ -x hack/tools.sh ]]; then
    local k
    k="$(hack/tools.sh env 2>/dev/null | sed -n 's/^KIND=//p')"
    if [[ -n "${k}" && -x "${k}" ]]; then echo "${k}"; return; fi
  fi
}

kind_load() {
  local kind cluster="${KIND_CLUSTER:-rl-platform}" f image
  kind="$(kind_bin)"
  if [[ -z "${kind}" ]]; then log "kind-load: no kind binary (hack/tools.sh kind builds one); nothing to do"; return 0; fi
  if ! "${kind}" get clusters 2>/dev/null | grep -qx "${cluster}"; then
    log "kind-load: no kind cluster named '${cluster}' (set KIND_CLUSTER); nothing to do"
    return 0
  fi
  ensure_dockerd
  local auto=0
  if [[ $# -eq 0 ]]; then auto=1; set -- cpu gpu; fi
  for f in "$@"; do
    image="$(image_of "${f}")"
    if ! have_image "${image}"; then
      if ((auto)) && [[ "${f}" == gpu ]]; then log "kind-load: ${image} not built (make images-gpu); skipped"; continue; fi
      die "${image} is not built (make images)"
    fi
    log "kind load docker-image ${image} --name ${cluster}"
    "${kind}" load docker-image "${image}" --name "${cluster}"
  done
}

# One build at a time per machine: the staged CA (docker/certs/) and the wheelhouse port are shared. Also held shared:
# the lock the cluster tier takes exclusive around its host photographs (tests/trainer_helpers.py
# docker_containers_lock), which a build's containers and debootstrap's chroot mounts would change.
lock() {
  mkdir -p "${CACHE}/logs"
  exec 9>"${CACHE}/images.lock"
  if ! flock -n 9; then
    log "waiting for another hack/images.sh build"
    "${ROOT}/hack/background.sh" boost
    flock -w 3600 9 || die "another hack/images.sh build holds ${CACHE}/images.lock"
  fi
  exec 8>>"${CACHE}/logs/docker-containers.lock"
  flock -s -w 600 8 || die "the cluster tier's host photograph held ${CACHE}/logs/docker-containers.lock for 10 min"
}

# ---------------------------------------------------------------------------------------------------- main
# All of it inside a function: bash parses it whole before running, so editing this file while a build runs
# cannot derail that build.
main() {
  local cmd="${1:-build}" f wpid total explicit
  [[ $# -gt 0 ]] && shift
  local flavours=("$@")
  explicit=${#flavours[@]}
  [[ ${#flavours[@]} -gt 0 ]] || flavours=(cpu)
  for f in "${flavours[@]}"; do image_of "${f}" >/dev/null; done

  case "${cmd}" in
    build)
      trap cleanup EXIT
      lock
      total=${SECONDS}
      # The wheelhouse (network: pip) and the base image (network: debootstrap) are independent: fill in parallel.
      wpid=""
      if [[ "${USE_WHEELHOUSE}" == 1 ]]; then
        ( for f in "${flavours[@]}"; do if uses_pip "${f}"; then ensure_wheels "${f}" >/dev/null; fi; done ) &
        wpid=$!
      fi
      ensure_base
      if [[ -n "${wpid}" ]]; then wait "${wpid}" || die "filling the wheelhouse failed"; fi
      for f in "${flavours[@]}"; do build_one "${f}"; done
      log "all done in $((SECONDS - total)) s"
      report "${flavours[@]}"
      ;;
    dockerd) ensure_dockerd ;;
    base) ensure_base ;;
    wheels) lock; for f in "${flavours[@]}"; do ensure_wheels "${f}"; done ;;
    pipcheck) trap cleanup EXIT; lock; pipcheck ;;
    kind-load) if ((explicit)); then kind_load "${flavours[@]}"; else kind_load; fi ;;
    report) ensure_dockerd; report "${flavours[@]}" ;;
    tag) image_of "${flavours[0]}" ;;
    -h | --help | help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' ;;
    *) die "unknown command '${cmd}' (see $0 --help)" ;;
  esac
}

main "$@"
