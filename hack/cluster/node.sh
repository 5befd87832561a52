#!/usr/bin/env bash
# The Level B real node of the local cluster: this machine runs pods for real, next to the control plane of
# hack/cluster.sh (which calls `node.sh up` once its apiserver answers, and `node.sh down` before it removes
# CLUSTER_DIR).
#
# Usage: hack/cluster/node.sh up|down|status|host-snapshot
#   up             install what is missing (apt), then start, each only when not already running and healthy:
#                  a containerd of our own, the CNI config (bridge on ${BRIDGE}), the images (pause, project CPU
#                  image), kubelet, kube-proxy (iptables), CoreDNS on ${NODE_IP}:53 + the kube-dns Service; waits
#                  for the node to be Ready and prints the bring-up seconds per step.
#   down           stop all of it (pods and containers too) and undo every host change `up` made: iptables chains,
#                  network namespaces, mounts, cgroups, sysctls, files. Keeps the containerd image store
#                  (${RLP_CACHE}/containerd-root) unless RLP_NODE_KEEP_IMAGES=0. One real node per machine:
#                  /run/rl-platform/owner names the CLUSTER_DIR whose node runs; `up` for another CLUSTER_DIR
#                  refuses, `down` for another one does nothing (RLP_NODE_FORCE=1: clean up without a host-state).
#   status         one line per component.
#   host-snapshot  a normalized picture of what up/down touch (sysctls, iptables, links, routes, netns, mounts,
#                  cgroups, files, our processes and their listening sockets); `down` must leave it as before `up`:
#                  diff <(node.sh host-snapshot) ... around an up/down cycle.
#
# Contract (hack/cluster/common.sh; made by hack/cluster.sh before `up`): ${PKI}/ca.crt + ca.key, the kubeconfigs
# ${CLUSTER_DIR}/{kubelet,kube-proxy,admin}.kubeconfig, bridge ${BRIDGE} holding ${NODE_IP}, apiserver at
# ${APISERVER_URL}.
#
# Listens on: kubelet ${NODE_IP}:10250 (healthz 127.0.0.1:10248), kube-proxy 127.0.0.1:10249/10256, CoreDNS
# ${NODE_IP}:53 (health 127.0.0.1:18053, ready 127.0.0.1:18054), containerd /run/rl-platform/containerd/containerd.sock
# (its CRI streaming server on 127.0.0.1, random port). hack/cluster/node-smoke.sh checks real pods on it.
#
# Environment (all optional):
#   RLP_NODE_IMAGES        docker images imported into containerd (default: IMAGE_CPU and IMAGE_REDIS of mk/versions.mk; built with
#                          hack/images.sh when Docker lacks it). "" imports none besides the pause image.
#   RLP_NODE_KEEP_IMAGES   1 (default): `down` keeps the containerd image store; 0: removes it too.
#   RLP_NODE_KEEP_LAYERS   0 (default): once an image is unpacked, its layer blobs leave the content store (what
#                          containerd's CRI option discard_unpacked_layers does for pulls): the node holds each image
#                          once (the snapshot), not twice. 1: keep them.
#   RLP_NODE_READY_TIMEOUT seconds `up` waits for the node to be Ready (default 180).
#   RLP_CTR_ROOT           containerd's root (image store), default ${RLP_CACHE}/containerd-root.
#   K8S_BIN COREDNS PAUSE_IMAGE_TAR PAUSE_IMAGE   tool paths (default: `hack/tools.sh env`).
set -euo pipefail

# shellcheck source=hack/cluster/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# SYSCTLS, HOST_PATHS, HOST_DAEMONS, RUN_DIR: every host change this script may make, listed once (the teardown test
# reads the same list).
# shellcheck source=hack/cluster/host-changes.sh
source "$(dirname "${BASH_SOURCE[0]}")/host-changes.sh"

NODE_DIR="${CLUSTER_DIR}/node"                  # per-run config, certs, kubelet root, CNI config and IPAM state
HOST_STATE="${CLUSTER_DIR}/host-state"          # host values recorded before the first change; `down` restores them
CTR_ROOT="${RLP_CTR_ROOT:-${RLP_CACHE}/containerd-root}"   # image store: kept across down/up (a cache)
CTR_STATE="${RUN_DIR}/containerd"
CTR_SOCK="${CTR_STATE}/containerd.sock"
RUNC_ROOT="${RUN_DIR}/runc"
OWNER_FILE="${RUN_DIR}/owner"                   # the CLUSTER_DIR whose node runs here: one real node per machine
CNI_BIN_DIR="/usr/lib/cni"
CNI_CONF_DIR="${NODE_DIR}/cni/net.d"
CNI_IPAM_DIR="${NODE_DIR}/cni/ipam"
CNI_NET_NAME="rl-platform"
KUBELET_DIR="${NODE_DIR}/kubelet"               # kubelet --root-dir (volumes, pod dirs, plugin sockets)
POD_LOGS_DIR="${NODE_DIR}/pod-logs"             # kubelet podLogsDir (instead of /var/log/pods)
NODE_PKI="${NODE_DIR}/pki"
FW_CHAIN="RLP-FORWARD"                          # our filter chain, jumped to from FORWARD
KUBELET_HEALTHZ_PORT=10248
KUBELET_PORT=10250
PROXY_METRICS_PORT=10249
PROXY_HEALTHZ_PORT=10256
COREDNS_HEALTH_PORT=18053
COREDNS_READY_PORT=18054
NODE_LABELS="rl-platform.io/pool=cpu,rl-platform.io/node=real"
READY_TIMEOUT="${RLP_NODE_READY_TIMEOUT:-180}"
KEEP_IMAGES="${RLP_NODE_KEEP_IMAGES:-1}"

log() { printf '[node] %s\n' "$*" >&2; }
die() { printf 'node.sh: %s\n' "$*" >&2; exit 1; }
PY="$(command -v /usr/bin/python3 || command -v python3)"

# ------------------------------------------------------------------------------------------------------- tools
load_tools() {
  local k v
  if [[ -z "${K8S_BIN:-}" || -z "${COREDNS:-}" || -z "${PAUSE_IMAGE_TAR:-}" || -z "${PAUSE_IMAGE:-}" ]]; then
    while IFS='=' read -r k v; do
      case "${k}" in
        K8S_BIN) K8S_BIN="${K8S_BIN:-${v}}" ;;
        COREDNS) COREDNS="${COREDNS:-${v}}" ;;
        PAUSE_IMAGE_TAR) PAUSE_IMAGE_TAR="${PAUSE_IMAGE_TAR:-${v}}" ;;
        PAUSE_IMAGE) PAUSE_IMAGE="${PAUSE_IMAGE:-${v}}" ;;
      esac
    done < <("${RLP_ROOT}/hack/tools.sh" env)
  fi
  KUBELET="${K8S_BIN}/kubelet"; KUBE_PROXY="${K8S_BIN}/kube-proxy"; KUBECTL="${K8S_BIN}/kubectl"
  IMAGE_CPU="$(sed -n 's/^IMAGE_CPU[[:space:]]*:=[[:space:]]*\([^[:space:]]*\).*/\1/p' "${RLP_ROOT}/mk/versions.mk")"
  IMAGE_REDIS="$(sed -n 's/^IMAGE_REDIS[[:space:]]*:=[[:space:]]*\([^[:space:]]*\).*/\1/p' "${RLP_ROOT}/mk/versions.mk")"
  NODE_IMAGES="${RLP_NODE_IMAGES-${IMAGE_CPU} ${IMAGE_REDIS}}"
}
need_tools() {
  local f
  for f in "${KUBELET}" "${KUBE_PROXY}" "${KUBECTL}" "${COREDNS}"; do
    [[ -x "${f}" ]] || die "missing ${f}: build it with hack/tools.sh cluster"
  done
  [[ -f "${PAUSE_IMAGE_TAR}" ]] || die "missing ${PAUSE_IMAGE_TAR}: build it with hack/tools.sh pause"
}
kc() { "${KUBECTL}" --kubeconfig "${KUBECONFIG_ADMIN}" --request-timeout=20s "$@"; }
ctr_() { ctr --address "${CTR_SOCK}" --namespace k8s.io "$@"; }

# ------------------------------------------------------------------------------------------------------- daemons
pid_of() { [[ -r "${PIDS}/$1.pid" ]] && cat "${PIDS}/$1.pid" 2>/dev/null || true; }
alive() { # alive NAME: the process of ${PIDS}/NAME.pid runs (not a zombie) and is the program NAME runs
  local pid; pid="$(pid_of "$1")"
  [[ -n "${pid}" && -r "/proc/${pid}/stat" ]] || return 1
  [[ "$(awk '{print $3}' "/proc/${pid}/stat" 2>/dev/null)" != Z ]] || return 1
  [[ "$(cat "/proc/${pid}/comm" 2>/dev/null)" == "$(comm_of "$1")" ]]
}
comm_of() { case "$1" in kube-proxy) echo kube-proxy ;; *) echo "$1" ;; esac; }
starting_or_alive() { # alive, or still on its way through start_daemon's `setsid nohup` exec chain
  local pid comm; pid="$(pid_of "$1")"
  [[ -n "${pid}" && -r "/proc/${pid}/stat" && "$(awk '{print $3}' "/proc/${pid}/stat" 2>/dev/null)" != Z ]] || return 1
  comm="$(cat "/proc/${pid}/comm" 2>/dev/null)"
  [[ "${comm}" == "$(comm_of "$1")" || "${comm}" == setsid || "${comm}" == nohup || "${comm}" == bash ]]
}
start_daemon() { # start_daemon NAME CMD...: setsid/nohup, pid in ${PIDS}/NAME.pid, log in ${LOGS}/NAME.log
  local name="$1"; shift
  mkdir -p "${PIDS}" "${LOGS}"
  printf '\n==== %s start %s\n' "$(date -u +%FT%TZ)" "$*" >>"${LOGS}/${name}.log"
  setsid nohup "$@" >>"${LOGS}/${name}.log" 2>&1 </dev/null 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &
  echo $! >"${PIDS}/${name}.pid"
}
cmdline_of() { # the command-line fragment that is unique to our instance of NAME
  case "$1" in
    containerd) echo "--config ${NODE_DIR}/containerd.toml" ;;
    kubelet) echo "--root-dir=${KUBELET_DIR}" ;;
    kube-proxy) echo "--config=${NODE_DIR}/kube-proxy.yaml" ;;
    coredns) echo "-conf ${NODE_DIR}/Corefile" ;;
  esac
}
pids_of() { # pids_of NAME: the pid file's process and any process running our command line of NAME
  local p
  alive "$1" && pid_of "$1"
  for p in $(pgrep -x "$(comm_of "$1")" 2>/dev/null || true); do
    tr '\0' ' ' <"/proc/${p}/cmdline" 2>/dev/null | grep -qF -- "$(cmdline_of "$1")" && echo "${p}"
  done
  return 0
}
stop_daemon() { # stop_daemon NAME [SECONDS]: TERM, then KILL after SECONDS (default 15)
  local name="$1" wait_s="${2:-15}" pids i
  pids="$(pids_of "${name}" | sort -u | tr '\n' ' ')"
  if [[ -n "${pids// /}" ]]; then
    # shellcheck disable=SC2086 # a list of pids
    kill -TERM ${pids} 2>/dev/null || true
    for ((i = 0; i < wait_s * 5; i++)); do [[ -n "$(pids_of "${name}")" ]] || break; sleep 0.2; done
    pids="$(pids_of "${name}" | sort -u | tr '\n' ' ')"
    if [[ -n "${pids// /}" ]]; then
      log "${name} (pid ${pids}) ignored SIGTERM: SIGKILL"
      # shellcheck disable=SC2086 # a list of pids
      kill -KILL ${pids} 2>/dev/null || true; sleep 0.5
    fi
  fi
  rm -f "${PIDS}/${name}.pid"
}
wait_for() { # wait_for WHAT SECONDS NAME CMD...: until CMD succeeds; dies (log tail of NAME) on timeout or exit
  local what="$1" secs="$2" name="$3"; shift 3
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ! starting_or_alive "${name}"; then
      tail -n 25 "${LOGS}/${name}.log" >&2 || true
      die "${name} exited while waiting for ${what} (log: ${LOGS}/${name}.log)"
    fi
    if ((SECONDS >= deadline)); then
      tail -n 25 "${LOGS}/${name}.log" >&2 || true
      die "${name}: no ${what} after ${secs}s (log: ${LOGS}/${name}.log)"
    fi
    sleep 0.5
  done
}
http_ok() { curl -fsS --max-time 3 "$1" >/dev/null; }

# ------------------------------------------------------------------------------------------------------- timings
FIGURES=()
T0=0
step() { T0=${SECONDS}; log "$*"; }
done_step() { FIGURES+=("$1 $((SECONDS - T0))s${2:+ ($2)}"); }

# ------------------------------------------------------------------------------------------------------- packages
ensure_packages() {
  local missing=() p
  command -v containerd >/dev/null && command -v ctr >/dev/null && command -v containerd-shim-runc-v2 >/dev/null \
    || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  for p in bridge host-local portmap loopback; do
    [[ -x "${CNI_BIN_DIR}/${p}" ]] || { missing+=(containernetworking-plugins); break; }
  done
  command -v iptables >/dev/null && command -v ip6tables >/dev/null && command -v iptables-save >/dev/null \
    || missing+=(iptables)
  command -v conntrack >/dev/null || missing+=(conntrack)
  # iptables-nft: kube-proxy and the kubelet create nft tables (ip mangle, ip6 filter/nat/mangle) that only nft removes
  if iptables -V 2>/dev/null | grep -q nf_tables || ! command -v iptables >/dev/null; then
    command -v nft >/dev/null || missing+=(nftables)
  fi
  command -v ip >/dev/null || missing+=(iproute2)
  command -v openssl >/dev/null || missing+=(openssl)
  command -v curl >/dev/null || missing+=(curl)
  ((${#missing[@]})) || return 0
  log "installing ${missing[*]} (apt-get)"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; then
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  fi
  # A Debian containerd package may come with a service that starts the system containerd; ours is separate.
}

# ------------------------------------------------------------------------------------------------------- host state
record_host_state() { # once, before the first change: `down` restores from it
  [[ -f "${HOST_STATE}" ]] && return 0
  local tmp="${HOST_STATE}.tmp" k v p bin t c fam
  mkdir -p "${CLUSTER_DIR}"
  {
    echo "# node.sh host state before \`up\` ($(date -u +%FT%TZ)); \`node.sh down\` restores it, then removes this file"
    for k in "${SYSCTLS[@]}"; do
      v="$(sysctl -n "${k}" 2>/dev/null | tr -s '[:space:]' ' ' | sed 's/ $//')" || v=""
      [[ -n "${v}" ]] && echo "sysctl ${k} ${v}"
    done
    # the bridge's own settings: the CNI bridge plugin sets net.ipv6.conf.${BRIDGE}.accept_ra=0, for one
    sysctl -a 2>/dev/null | grep -E "^net\.ipv[46]\.(conf|neigh)\.${BRIDGE}\." \
      | sed -E 's/[[:blank:]]+/ /g; s/ $//; s/^([^ ]+) = ?/sysctl \1 /' | awk 'NF >= 3'
    [[ -r /sys/module/nf_conntrack/parameters/hashsize ]] && echo "conntrack-hashsize $(cat /sys/module/nf_conntrack/parameters/hashsize)"
    for p in "${HOST_PATHS[@]}"; do [[ -e "${p}" ]] && echo "path-existed ${p}"; done
    for p in /run/netns/*; do [[ -e "${p}" ]] && echo "netns-existed ${p##*/}"; done
    for bin in iptables ip6tables; do
      command -v "${bin}-save" >/dev/null || continue
      "${bin}-save" 2>/dev/null | sed -n 's/^\*\(.*\)/table-existed '"${bin}"' \1/p'
      for t in filter nat mangle raw; do
        "${bin}-save" -t "${t}" 2>/dev/null | sed -n 's/^:\([^ ]*\) .*/\1/p' | while read -r c; do
          echo "chain-existed ${bin} ${t} ${c}"
        done
      done
    done
    if command -v nft >/dev/null; then
      for fam in ip ip6; do
        nft_base_chains "${fam}" | while read -r t c _; do echo "nft-chain-existed ${fam} ${t} ${c}"; done
      done
    fi
  } >"${tmp}"
  mv "${tmp}" "${HOST_STATE}"
}
state_has() { [[ -f "${HOST_STATE}" ]] && grep -qxF "$*" "${HOST_STATE}"; }
nft_base_chains() { # nft_base_chains FAMILY: "table chain policy" of each chain with a hook
  nft list chains "$1" 2>/dev/null | awk '/^table /{t=$3} /^[[:space:]]+chain /{c=$2} /hook/{p=$NF; sub(/;$/, "", p); print t, c, p}'
}

restore_host_state() {
  if [[ ! -f "${HOST_STATE}" ]]; then
    log "WARNING: no ${HOST_STATE}: sysctls are not restored (kubelet sets vm.overcommit_memory=1 vm.panic_on_oom=0 kernel.panic=10 kernel.panic_on_oops=1)"
    return 0
  fi
  local kind k v cur
  while read -r kind k v; do
    case "${kind}" in
      sysctl)
        cur="$(sysctl -n "${k}" 2>/dev/null | tr -s '[:space:]' ' ' | sed 's/ $//')" || continue
        if [[ "${cur}" != "${v}" ]]; then
          if [[ "${k}" == net.ipv4.ip_forward || "${k}" == net.ipv4.conf.all.forwarding ]] && [[ "${v}" == 0 ]] && docker_engine_running; then
            log "keeping ${k}=${cur} (was ${v}): a Docker engine runs now and needs forwarding"
            continue
          fi
          log "restoring sysctl ${k}=${v} (was ${cur})"
          sysctl -qw "${k}=${v}" || log "WARNING: could not restore ${k}=${v}"
        fi ;;
      conntrack-hashsize)
        cur="$(cat /sys/module/nf_conntrack/parameters/hashsize 2>/dev/null || true)"
        [[ -n "${cur}" && "${cur}" != "${k}" ]] && { echo "${k}" >/sys/module/nf_conntrack/parameters/hashsize || true; } ;;
    esac
  done < <(grep -v '^#' "${HOST_STATE}")
}
docker_engine_running() { pgrep -x dockerd >/dev/null 2>&1; }

# ------------------------------------------------------------------------------------------------------- owner
# One real node per machine (node name, ports, the bridge's CNI, kubepods cgroups, ${RUN_DIR}): ${OWNER_FILE} names
# the CLUSTER_DIR whose node runs. `up` refuses to start a second one; `down` of another CLUSTER_DIR leaves it alone.
owner() { cat "${OWNER_FILE}" 2>/dev/null || true; }
check_owner() {
  local o; o="$(owner)"
  [[ -z "${o}" || "${o}" == "${CLUSTER_DIR}" ]] && return 0
  if [[ -f "${o}/host-state" ]] || pgrep -x kubelet >/dev/null || containerd_ok; then
    die "this machine's real node belongs to the cluster in ${o}: bring it down first (RLP_CLUSTER_DIR=${o} $0 down)"
  fi
  log "removing the stale owner ${o} (its state is gone and no node runs)"
  rm -f "${OWNER_FILE}"
}
claim_owner() { mkdir -p "${RUN_DIR}"; echo "${CLUSTER_DIR}" >"${OWNER_FILE}"; }

# ------------------------------------------------------------------------------------------------------- preflight
preflight() {
  [[ "$(id -u)" == 0 ]] || die "needs root (a kubelet, containerd, iptables)"
  local f
  for f in "${PKI}/ca.crt" "${PKI}/ca.key" "${CLUSTER_DIR}/kubelet.kubeconfig" "${CLUSTER_DIR}/kube-proxy.kubeconfig" \
           "${KUBECONFIG_ADMIN}"; do
    [[ -s "${f}" ]] || die "missing ${f} (made by hack/cluster.sh up before it calls node.sh up)"
  done
  ip -4 -o addr show dev "${BRIDGE}" 2>/dev/null | grep -qw "${NODE_IP}" \
    || die "bridge ${BRIDGE} with ${NODE_IP} missing (hack/cluster.sh up creates it)"
  kc get --raw /readyz >/dev/null 2>&1 || die "the apiserver ${APISERVER_URL} does not answer (hack/cluster.sh up)"
}

# ------------------------------------------------------------------------------------------------------- certs
sign_cert() { # sign_cert NAME CN O EXT: key + cert in ${NODE_PKI}, signed by the cluster CA (kept while it verifies)
  local name="$1" cn="$2" o="$3" ext="$4" subj
  mkdir -p "${NODE_PKI}"
  if [[ -s "${NODE_PKI}/${name}.crt" ]] && openssl verify -CAfile "${PKI}/ca.crt" "${NODE_PKI}/${name}.crt" >/dev/null 2>&1; then
    return 0
  fi
  subj="/CN=${cn}"; [[ -n "${o}" ]] && subj="/O=${o}${subj}"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "${NODE_PKI}/${name}.key" 2>/dev/null
  chmod 600 "${NODE_PKI}/${name}.key"
  openssl req -new -key "${NODE_PKI}/${name}.key" -subj "${subj}" -out "${NODE_PKI}/${name}.csr" 2>/dev/null
  printf '%s\n' "${ext}" >"${NODE_PKI}/${name}.ext"
  openssl x509 -req -in "${NODE_PKI}/${name}.csr" -CA "${PKI}/ca.crt" -CAkey "${PKI}/ca.key" -CAcreateserial \
    -CAserial "${NODE_PKI}/ca.srl" -days 365 -sha256 -extfile "${NODE_PKI}/${name}.ext" \
    -out "${NODE_PKI}/${name}.crt" 2>/dev/null
  rm -f "${NODE_PKI}/${name}.csr" "${NODE_PKI}/${name}.ext"
}
write_kubeconfig() { # write_kubeconfig FILE USER CERT KEY
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: rl-platform
  cluster:
    server: ${APISERVER_URL}
    certificate-authority: ${PKI}/ca.crt
users:
- name: $2
  user:
    client-certificate: $3
    client-key: $4
contexts:
- name: $2@rl-platform
  context: {cluster: rl-platform, user: $2}
current-context: $2@rl-platform
EOF
  chmod 600 "$1"
}

# ------------------------------------------------------------------------------------------------------- containerd
containerd_ok() { ctr --address "${CTR_SOCK}" version >/dev/null 2>&1; }
write_containerd_config() {
  mkdir -p "${NODE_DIR}" "${CTR_ROOT}"
  cat >"${NODE_DIR}/containerd.toml" <<EOF
# rl-platform's own containerd (hack/cluster/node.sh): Docker's containerd is not touched.
version = 2
root = "${CTR_ROOT}"
state = "${CTR_STATE}"
oom_score = 0
# opt would populate /opt/containerd; the other snapshotters are not used.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "${CTR_SOCK}"
[ttrpc]
  address = "${CTR_STATE}/containerd.sock.ttrpc"
[debug]
  address = ""
  level = "info"
[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "${PAUSE_IMAGE}"
  # No CAP_SYS_RESOURCE here: negative OOM score adjustments fail, so clamp them.
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  # cgroup v1 without the hugetlb hierarchy
  disable_hugetlb_controller = true
  tolerate_missing_hugetlb_controller = true
  max_container_log_line_size = 16384
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "${RUNC_ROOT}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "${CNI_BIN_DIR}"
    conf_dir = "${CNI_CONF_DIR}"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = ""

[plugins."io.containerd.runtime.v1.linux"]
  runtime_root = "${RUNC_ROOT}"

# Collect garbage after every deletion (the default waits for 100 mutations): the layer blobs `ctr_image discard` drops
# and a replaced build's snapshots leave the disk at once.
[plugins."io.containerd.gc.v1.scheduler"]
  deletion_threshold = 1
EOF
}
up_containerd() {
  step "containerd (socket ${CTR_SOCK}, root ${CTR_ROOT})"
  write_cni_config  # before containerd starts, so the CRI reports the network ready at once
  if alive containerd && containerd_ok; then done_step containerd "already running"; return 0; fi
  alive containerd && die "containerd (pid $(pid_of containerd)) runs but ${CTR_SOCK} does not answer (log: ${LOGS}/containerd.log)"
  write_containerd_config
  mkdir -p "${CTR_STATE}" "${RUNC_ROOT}"
  start_daemon containerd containerd --config "${NODE_DIR}/containerd.toml"
  wait_for "an answer on ${CTR_SOCK}" 60 containerd containerd_ok
  done_step containerd
}

# ------------------------------------------------------------------------------------------------------- CNI
write_cni_config() {
  mkdir -p "${CNI_CONF_DIR}" "${CNI_IPAM_DIR}"
  cat >"${CNI_CONF_DIR}/10-${CNI_NET_NAME}.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "${CNI_NET_NAME}",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "${BRIDGE}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "${CNI_IPAM_DIR}",
        "ranges": [[{"subnet": "${NODE_CIDR}", "rangeStart": "${POD_RANGE_START}", "rangeEnd": "${POD_RANGE_END}",
                     "gateway": "${NODE_IP}"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}
up_host_network() {
  # Forwarding: service traffic from a pod to another pod (DNAT on the host) is routed back out of ${BRIDGE}. The CNI
  # bridge plugin (isGateway) turns net.ipv4.ip_forward on itself; the bridge's own switch must be on as well.
  # Both values are in ${HOST_STATE}; `down` puts them back.
  [[ "$(sysctl -n net.ipv4.ip_forward)" == 1 ]] || sysctl -qw net.ipv4.ip_forward=1
  [[ "$(sysctl -n "net.ipv4.conf.${BRIDGE}.forwarding")" == 1 ]] || sysctl -qw "net.ipv4.conf.${BRIDGE}.forwarding=1"
  up_firewall
}
up_firewall() {
  # Docker sets the FORWARD policy to DROP: accept pod<->pod traffic on our bridge (incl. service traffic DNATed to
  # a pod), and drop anything a pod would route off the bridge, so no cluster traffic leaves this machine (there is
  # no masquerade either). Pod->host traffic is INPUT and not affected.
  iptables -t filter -N "${FW_CHAIN}" 2>/dev/null || true
  iptables -t filter -F "${FW_CHAIN}"
  iptables -t filter -A "${FW_CHAIN}" -i "${BRIDGE}" -o "${BRIDGE}" -m comment --comment "rl-platform pods" -j ACCEPT
  iptables -t filter -A "${FW_CHAIN}" -i "${BRIDGE}" -m comment --comment "rl-platform pods stay on this machine" -j DROP
  iptables -t filter -C FORWARD -j "${FW_CHAIN}" 2>/dev/null || iptables -t filter -I FORWARD 1 -j "${FW_CHAIN}"
}

# ------------------------------------------------------------------------------------------------------- images
# ref_of NAME: the reference containerd stores for a docker image name (docker.io/library/... normalization)
ref_of() {
  local n="$1" first="${1%%/*}"
  if [[ "${n}" != */* ]]; then n="docker.io/library/${n}"
  elif [[ "${first}" != *.* && "${first}" != *:* && "${first}" != localhost ]]; then n="docker.io/${n}"; fi
  [[ "${n##*/}" == *:* || "${n}" == *@* ]] || n="${n}:latest"
  printf '%s' "${n}"
}
# ctr_image id|discard REF, one helper over the image's manifest in containerd (an index: its linux/amd64 manifest):
#   id       the image's config digest (= docker image ID), or nothing when containerd lacks REF.
#   discard  remove the layer blobs of the unpacked image from the content store; prints "COUNT BYTES". Containers
#            start from the snapshot, which the image config (kept) names; the blobs are needed only to unpack
#            again, which an imported image never is. Refuses when the config names no snapshot (not unpacked).
ctr_image() {
  "${PY}" - "${CTR_SOCK}" "$@" <<'EOF'
import json, subprocess, sys
sock, mode, ref = sys.argv[1:4]
def run(*a):
    return subprocess.run(["ctr", "--address", sock, "-n", "k8s.io", *a], check=True, capture_output=True,
                          text=True).stdout
def get(d):
    return json.loads(run("content", "get", d))
rows = run("images", "ls", f"name=={ref}").splitlines()[1:]
if not rows:
    sys.exit(0 if mode == "id" else f"node.sh: containerd has no image {ref}")
m = get(rows[0].split()[2])
if "manifests" in m:
    ms = [x for x in m["manifests"] if x.get("platform", {}).get("os", "linux") == "linux"
          and x.get("platform", {}).get("architecture", "amd64") == "amd64"] or m["manifests"]
    m = get(ms[0]["digest"])
config = m["config"]["digest"]
if mode == "id":
    print(config)
    sys.exit(0)
row = [r for r in run("content", "ls").splitlines() if r.startswith(config)]
if not row or "containerd.io/gc.ref.snapshot." not in row[0]:
    sys.exit(f"node.sh: {ref} is not unpacked (its config {config[:19]} names no snapshot); keeping its layers")
have = set(run("content", "ls", "-q").split())
gone = [l for l in m["layers"] if l["digest"] in have]
if gone:
    run("content", "rm", *[l["digest"] for l in gone])
print(len(gone), sum(l["size"] for l in gone))
EOF
}
ctr_image_id() { ctr_image id "$1" 2>/dev/null || true; }
disk_free_bytes() { df -PB1 "$1" | awk 'NR == 2 {print $4}'; }
import_tar_image() { # import_tar_image REF ID TAR-or-"-" (stdin)
  local ref="$1" want="$2" src="$3" got
  ctr_ images import "${src}" >/dev/null
  got="$(ctr_image_id "${ref}")"
  [[ "${got}" == "${want}" ]] || die "imported ${ref} but containerd has ${got:-nothing}, expected ${want}"
}
up_images() {
  step "images into containerd (k8s.io namespace)"
  local notes=() ref want have t
  # The pause image: its ID is the config file named in the tarball's manifest.json.
  ref="$(ref_of "${PAUSE_IMAGE}")"
  want="sha256:$(tar -xOf "${PAUSE_IMAGE_TAR}" manifest.json | "${PY}" -c 'import json,sys; print(json.load(sys.stdin)[0]["Config"].rsplit("/", 1)[-1].removesuffix(".json"))')"
  have="$(ctr_image_id "${ref}")"
  if [[ "${have}" == "${want}" ]]; then notes+=("pause present")
  else t=${SECONDS}; import_tar_image "${ref}" "${want}" "${PAUSE_IMAGE_TAR}"; notes+=("pause imported $((SECONDS - t))s"); fi
  local img
  for img in ${NODE_IMAGES}; do
    ref="$(ref_of "${img}")"
    have="$(ctr_image_id "${ref}")"
    if ! timeout 20 docker info >/dev/null 2>&1; then
      if [[ -n "${have}" ]]; then
        notes+=("${img} present (no Docker engine running to compare with; kept ${have:7:12})"); continue
      fi
      log "${img} is not in containerd: starting a Docker engine (hack/images.sh dockerd)"
      "${RLP_ROOT}/hack/images.sh" dockerd >&2  # stdout is the env line of `hack/cluster.sh up`
    fi
    want="$(docker image inspect -f '{{.Id}}' "${img}" 2>/dev/null || true)"
    if [[ -z "${want}" ]]; then
      local flavour=""
      case "${img}" in "${IMAGE_CPU}") flavour=cpu ;; "${IMAGE_REDIS}") flavour=redis ;; esac
      [[ -n "${flavour}" ]] || die "docker has no image ${img} (RLP_NODE_IMAGES)"
      log "docker has no ${img}: building it (hack/images.sh build ${flavour}; cpu cold ~6 min)"
      t=${SECONDS}; "${RLP_ROOT}/hack/images.sh" build "${flavour}" >&2; notes+=("${img} built $((SECONDS - t))s")
      want="$(docker image inspect -f '{{.Id}}' "${img}")"
    fi
    if [[ "${have}" == "${want}" ]]; then notes+=("${img} present ${want:7:12}"); continue; fi
    # An older build under the same name: drop it first, by its name and by the ID name the CRI gives every image
    # (--sync: its snapshots and blobs are collected now), so the store never holds two versions of one image.
    if [[ -n "${have}" ]]; then
      log "replacing ${img} ${have:7:12} in containerd by ${want:7:12}"
      ctr_ images rm --sync "${ref}" "${have}" >/dev/null
    fi
    local size free need_b
    size="$(docker image inspect -f '{{.Size}}' "${img}")"
    free="$(disk_free_bytes "${CTR_ROOT}")"
    # The import's peak: the saved layers in the content store + the unpacked snapshot, + 1 GiB of headroom. The
    # layers go once unpacked (ctr_image discard), so pods get the rest; the kubelet's eviction threshold is set from
    # what is free after the import (eviction_bytes).
    need_b=$((2 * size + 1024 * 1024 * 1024))
    if ((free < need_b)); then
      die "not enough free disk for ${img} in ${CTR_ROOT}: $((free >> 20)) MiB free, need ~$((need_b >> 20)) MiB while importing (2x the image's $((size >> 20)) MiB + 1 GiB; $((size >> 20)) MiB once imported); free space (docker image prune, RLP_NODE_KEEP_IMAGES=0 ${0} down) or set RLP_CTR_ROOT"
    fi
    log "importing ${img} ($((size >> 20)) MiB) into containerd: docker save | ctr import"
    t=${SECONDS}
    docker save "${img}" | import_tar_image "${ref}" "${want}" -
    notes+=("${img} imported $((SECONDS - t))s")
    if [[ "${RLP_NODE_KEEP_LAYERS:-0}" != 1 ]]; then
      local d; d="$(ctr_image discard "${ref}")"; notes+=("${img}: ${d%% *} layer blobs ($(( ${d##* } >> 20 )) MiB) discarded")
    fi
  done
  local n joined=""; for n in "${notes[@]}"; do joined+="${joined:+; }${n}"; done
  done_step images "${joined}"
}

# ------------------------------------------------------------------------------------------------------- kubelet
eviction_bytes() { # hard eviction threshold for nodefs/imagefs: 10% of the free disk, between 1 and 5 GiB
  local free g=$((1024 * 1024 * 1024)) e
  free="$(disk_free_bytes "${CTR_ROOT}")"
  e=$((free / 10)); ((e < g)) && e=${g}; ((e > 5 * g)) && e=$((5 * g))
  echo "${e}"
}
write_kubelet_config() {
  local ev_mi; ev_mi=$(($(eviction_bytes) >> 20))
  mkdir -p "${KUBELET_DIR}" "${POD_LOGS_DIR}" "${NODE_DIR}/volume-plugins"
  cat >"${NODE_DIR}/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: ${NODE_IP}
port: ${KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ${KUBELET_HEALTHZ_PORT}
tlsCertFile: ${NODE_PKI}/kubelet-serving.crt
tlsPrivateKeyFile: ${NODE_PKI}/kubelet-serving.key
serverTLSBootstrap: false
rotateCertificates: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true, cacheTTL: 2m0s}
  x509: {clientCAFile: ${PKI}/ca.crt}
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://${CTR_SOCK}
cgroupDriver: cgroupfs
# cgroup v1 on this machine class: 1.34 only warns with this; 1.35+ needs it to start at all.
failCgroupV1: false
failSwapOn: false
clusterDNS: [${DNS_SVC_IP}]
clusterDomain: ${CLUSTER_DOMAIN}
# No host resolv.conf for pods: ClusterFirst pods get only the cluster DNS (no upstream, nothing leaves the machine).
resolvConf: ""
podLogsDir: ${POD_LOGS_DIR}
volumePluginDir: ${NODE_DIR}/volume-plugins
staticPodPath: ""
# The kubelet sets vm.overcommit_memory=1 vm.panic_on_oom=0 kernel.panic=10 kernel.panic_on_oops=1 (and the
# kernel.keys limits); with protectKernelDefaults it would refuse to start instead. node.sh records the values in
# ${HOST_STATE} first and \`down\` restores them.
protectKernelDefaults: false
# Images cannot be pulled here (no registry): never garbage-collect imported images by disk usage (100 = only when
# the disk is full); hard eviction (pods) starts at ${ev_mi} MiB free (10% of the free disk at bring-up, 1-5 GiB).
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
imageMinimumGCAge: 2m0s
evictionHard:
  memory.available: 256Mi
  nodefs.available: ${ev_mi}Mi
  imagefs.available: ${ev_mi}Mi
  nodefs.inodesFree: "5%"
  imagefs.inodesFree: "5%"
mergeDefaultEvictionSettings: false
containerLogMaxSize: 10Mi
containerLogMaxFiles: 3
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
maxPods: 110
EOF
}
up_kubelet() {
  step "kubelet (node ${NODE_NAME}, ${NODE_IP}, labels ${NODE_LABELS})"
  if alive kubelet && http_ok "http://127.0.0.1:${KUBELET_HEALTHZ_PORT}/healthz"; then done_step kubelet "already running"; return 0; fi
  alive kubelet && die "kubelet (pid $(pid_of kubelet)) runs but its healthz does not answer (log: ${LOGS}/kubelet.log)"
  sign_cert kubelet-serving "system:node:${NODE_NAME}" "system:nodes" \
    "$(printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
        "extendedKeyUsage=serverAuth" "subjectAltName=IP:${NODE_IP},DNS:${NODE_NAME}")"
  write_kubelet_config
  start_daemon kubelet "${KUBELET}" --config="${NODE_DIR}/kubelet-config.yaml" \
    --kubeconfig="${CLUSTER_DIR}/kubelet.kubeconfig" --root-dir="${KUBELET_DIR}" \
    --node-ip="${NODE_IP}" --hostname-override="${NODE_NAME}" --node-labels="${NODE_LABELS}" --v=2
  wait_for "healthz on 127.0.0.1:${KUBELET_HEALTHZ_PORT}" 90 kubelet http_ok "http://127.0.0.1:${KUBELET_HEALTHZ_PORT}/healthz"
  done_step kubelet
}

# ------------------------------------------------------------------------------------------------------- kube-proxy
up_kube_proxy() {
  step "kube-proxy (iptables, cluster CIDR ${POD_CIDR})"
  if alive kube-proxy && http_ok "http://127.0.0.1:${PROXY_HEALTHZ_PORT}/livez"; then done_step kube-proxy "already running"; return 0; fi
  alive kube-proxy && die "kube-proxy (pid $(pid_of kube-proxy)) runs but its livez does not answer (log: ${LOGS}/kube-proxy.log)"
  cat >"${NODE_DIR}/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: ${CLUSTER_DIR}/kube-proxy.kubeconfig
hostnameOverride: ${NODE_NAME}
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:${PROXY_HEALTHZ_PORT}
metricsBindAddress: 127.0.0.1:${PROXY_METRICS_PORT}
clusterCIDR: ${POD_CIDR}
detectLocalMode: ClusterCIDR
# NodePorts only on the node IP, not on 127.0.0.1: no route_localnet sysctl.
nodePortAddresses: ["${NODE_IP}/32"]
iptables:
  localhostNodePorts: false
  masqueradeAll: false
  syncPeriod: 30s
  minSyncPeriod: 1s
# 0 = leave the host's conntrack limits and timeouts as they are (no sysctl changes).
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
# No CAP_SYS_RESOURCE here: a negative OOM score would fail.
oomScoreAdj: 0
EOF
  start_daemon kube-proxy "${KUBE_PROXY}" --config="${NODE_DIR}/kube-proxy.yaml" --v=2
  wait_for "livez on 127.0.0.1:${PROXY_HEALTHZ_PORT}" 60 kube-proxy http_ok "http://127.0.0.1:${PROXY_HEALTHZ_PORT}/livez"
  done_step kube-proxy
}

# ------------------------------------------------------------------------------------------------------- CoreDNS
coredns_manifests() {
  cat <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: rl-platform:coredns
  labels: {app.kubernetes.io/managed-by: rl-platform-node-sh}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: rl-platform:coredns
  labels: {app.kubernetes.io/managed-by: rl-platform-node-sh}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "rl-platform:coredns"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:rl-platform:coredns"}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, kubernetes.io/name: CoreDNS, app.kubernetes.io/managed-by: rl-platform-node-sh}
spec:
  clusterIP: ${DNS_SVC_IP}
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-host
  namespace: kube-system
  labels:
    kubernetes.io/service-name: kube-dns
    endpointslice.kubernetes.io/managed-by: rl-platform-node-sh
    app.kubernetes.io/managed-by: rl-platform-node-sh
addressType: IPv4
endpoints:
- addresses: ["${NODE_IP}"]
  conditions: {ready: true}
  nodeName: ${NODE_NAME}
ports:
- {name: dns, port: 53, protocol: UDP}
- {name: dns-tcp, port: 53, protocol: TCP}
EOF
}
up_coredns() {
  step "CoreDNS on ${NODE_IP}:53 (zones ${CLUSTER_DOMAIN} in-addr.arpa ip6.arpa, no forwarder) + Service kube-dns ${DNS_SVC_IP}"
  coredns_manifests | kc apply -f - >/dev/null
  if alive coredns && http_ok "http://127.0.0.1:${COREDNS_READY_PORT}/ready"; then done_step coredns "already running"; return 0; fi
  alive coredns && die "coredns (pid $(pid_of coredns)) runs but is not ready (log: ${LOGS}/coredns.log)"
  # Least privilege: its own client certificate (user system:rl-platform:coredns) bound to list/watch only.
  sign_cert coredns "system:rl-platform:coredns" "" \
    "$(printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=clientAuth")"
  write_kubeconfig "${NODE_DIR}/coredns.kubeconfig" "system:rl-platform:coredns" "${NODE_PKI}/coredns.crt" "${NODE_PKI}/coredns.key"
  cat >"${NODE_DIR}/Corefile" <<EOF
${CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {
    bind ${NODE_IP}
    errors
    health 127.0.0.1:${COREDNS_HEALTH_PORT}
    ready 127.0.0.1:${COREDNS_READY_PORT}
    kubernetes ${CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {
        kubeconfig ${NODE_DIR}/coredns.kubeconfig
        pods insecure
        ttl 30
    }
    cache 30
    loadbalance
}
EOF
  start_daemon coredns "${COREDNS}" -conf "${NODE_DIR}/Corefile"
  wait_for "ready on 127.0.0.1:${COREDNS_READY_PORT}" 60 coredns http_ok "http://127.0.0.1:${COREDNS_READY_PORT}/ready"
  done_step coredns
}

# ------------------------------------------------------------------------------------------------------- Ready
node_ready() {
  [[ "$(kc get node "${NODE_NAME}" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}
wait_node_ready() {
  step "waiting for node ${NODE_NAME} to be Ready (at most ${READY_TIMEOUT}s)"
  local deadline=$((SECONDS + READY_TIMEOUT)) d
  until node_ready; do
    for d in containerd kubelet kube-proxy coredns; do
      alive "${d}" || { tail -n 25 "${LOGS}/${d}.log" >&2 || true; die "${d} exited while waiting for node ${NODE_NAME} to be Ready (log: ${LOGS}/${d}.log)"; }
    done
    if ((SECONDS >= deadline)); then
      echo "--- node ${NODE_NAME} conditions:" >&2
      kc get node "${NODE_NAME}" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}' >&2 2>&1 \
        || echo "(node ${NODE_NAME} is not registered)" >&2
      echo "--- last kubelet log lines (${LOGS}/kubelet.log):" >&2
      tail -n 30 "${LOGS}/kubelet.log" >&2 || true
      die "node ${NODE_NAME} not Ready after ${READY_TIMEOUT}s"
    fi
    sleep 1
  done
  done_step "node Ready"
}

cmd_up() {
  local t_all=${SECONDS}
  load_tools; need_tools
  step "packages"; ensure_packages; done_step packages
  preflight
  check_owner
  record_host_state
  claim_owner
  mkdir -p "${NODE_DIR}" "${LOGS}" "${PIDS}"
  up_containerd
  up_host_network
  up_images
  up_kubelet
  up_kube_proxy
  up_coredns
  wait_node_ready
  local f figs=""; for f in "${FIGURES[@]}"; do figs+="${figs:+, }${f}"; done
  log "node ${NODE_NAME} Ready; bring-up: ${figs}; total $((SECONDS - t_all))s"
}

# ------------------------------------------------------------------------------------------------------- down
our_shims() { # pids of containerd shims serving our containerd
  local p
  for p in $(pgrep -f 'containerd-shim' 2>/dev/null || true); do
    tr '\0' ' ' <"/proc/${p}/cmdline" 2>/dev/null | grep -qF -- "-address ${CTR_SOCK}" && echo "${p}"
  done
  return 0
}
stop_containers() {
  # The kubelet is stopped first, so nothing restarts pods; then every task (pod sandboxes and containers) in our
  # containerd is killed and deleted with its snapshot. CNI DEL does not run: the netns/IPAM/iptables left over
  # are removed below.
  containerd_ok || return 0
  local ids id n=0 i
  ids="$(ctr_ containers ls -q 2>/dev/null || true)"
  [[ -n "${ids}" ]] || return 0
  for id in ${ids}; do ctr_ tasks kill -s SIGKILL "${id}" >/dev/null 2>&1 || true; n=$((n + 1)); done
  for id in ${ids}; do
    for ((i = 0; i < 20; i++)); do
      ctr_ tasks delete "${id}" >/dev/null 2>&1 && break
      ctr_ tasks ls -q 2>/dev/null | grep -qx "${id}" || break
      sleep 0.25
    done
    ctr_ containers delete "${id}" >/dev/null 2>&1 || log "WARNING: could not delete container ${id}"
    echo "${id}" >>"${NODE_DIR}/.stopped-containers" 2>/dev/null || true
  done
  log "stopped ${n} containers (sandboxes included)"
}
kill_cgroup_procs() { # any process still in a kubepods cgroup is a container process of ours
  local f p n=0
  while read -r f; do
    while read -r p; do [[ -n "${p}" ]] && kill -KILL "${p}" 2>/dev/null && n=$((n + 1)); done <"${f}"
  done < <(find /sys/fs/cgroup/*/kubepods* -name cgroup.procs 2>/dev/null)
  ((n == 0)) || log "killed ${n} leftover container processes"
  return 0
}
remove_shim_sockets() { # /run/containerd/s/<sha256(address/ns/id)> of shims we SIGKILLed
  local id s
  [[ -f "${NODE_DIR}/.stopped-containers" ]] || return 0
  while read -r id; do
    s="$(printf '%s' "${CTR_SOCK}/k8s.io/${id}" | sha256sum | cut -d' ' -f1)"
    rm -f "/run/containerd/s/${s}"
  done <"${NODE_DIR}/.stopped-containers"
  rm -f "${NODE_DIR}/.stopped-containers"
}
cleanup_iptables() { # cleanup_iptables BIN: remove KUBE-*, CNI-* (not there before up) and our chain, with the jumps to them
  local bin="$1" t line chains c rest
  command -v "${bin}-save" >/dev/null || return 0
  for t in filter nat mangle raw; do
    chains=()
    while read -r c; do
      state_has "chain-existed ${bin} ${t} ${c}" && continue
      chains+=("${c}")
    done < <("${bin}-save" -t "${t}" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\|CNI-[^ ]*\|'"${FW_CHAIN}"'\) .*/\1/p')
    ((${#chains[@]})) || continue
    # the rules of other chains that jump to them
    while IFS= read -r line; do
      rest="${line#-A }"
      local chain="${rest%% *}" target skip=0
      for c in "${chains[@]}"; do [[ "${chain}" == "${c}" ]] && skip=1; done
      ((skip)) && continue
      target="$(sed -n 's/.* -[jg] \([^ ]*\).*/\1/p' <<<"${line}")"
      for c in "${chains[@]}"; do
        if [[ "${target}" == "${c}" ]]; then
          local args=()
          mapfile -d '' -t args < <("${PY}" -c 'import shlex,sys; sys.stdout.write("\0".join(shlex.split(sys.argv[1])) + "\0")' "${rest}")
          "${bin}" -t "${t}" -D "${args[@]}" 2>/dev/null || log "WARNING: ${bin} -t ${t} -D ${rest}: failed"
        fi
      done
    done < <("${bin}-save" -t "${t}" 2>/dev/null | grep '^-A ')
    for c in "${chains[@]}"; do "${bin}" -t "${t}" -F "${c}" 2>/dev/null || true; done
    for c in "${chains[@]}"; do "${bin}" -t "${t}" -X "${c}" 2>/dev/null || log "WARNING: ${bin} -t ${t} -X ${c}: failed"; done
  done
  # iptables-nft: tables that kube-proxy/kubelet created (absent before up) and that are empty now
  [[ -f "${HOST_STATE}" ]] && command -v nft >/dev/null && "${bin}" -V 2>/dev/null | grep -q nf_tables || return 0
  local fam=ip; [[ "${bin}" == ip6tables ]] && fam=ip6
  # base chains that kube-proxy/kubelet added to a table that existed before up (Docker's filter table gets INPUT and
  # OUTPUT on a new machine): iptables-nft creates one on first use and never removes it (and iptables-save lists
  # every built-in chain whether it exists or not: nft says which do); empty and accepting, it is as if absent
  local p
  while read -r t c p; do
    state_has "nft-chain-existed ${fam} ${t} ${c}" && continue
    [[ "${p}" == accept ]] || continue
    nft list chain "${fam}" "${t}" "${c}" 2>/dev/null | grep -v -E '^[[:space:]]*(table |chain |type |}|$)' | grep -q . \
      && continue
    nft delete chain "${fam}" "${t}" "${c}" 2>/dev/null || log "WARNING: nft delete chain ${fam} ${t} ${c} failed"
  done < <(nft_base_chains "${fam}")
  for t in $("${bin}-save" 2>/dev/null | sed -n 's/^\*//p'); do
    state_has "table-existed ${bin} ${t}" && continue
    # empty: only the built-in chains (":NAME POLICY"), no rules, no chains of its own ("- [0:0]")
    if ! "${bin}-save" -t "${t}" 2>/dev/null | grep -q -e '^-A ' -e '^:[^ ]* - '; then
      nft delete table "${fam}" "${t}" 2>/dev/null || log "WARNING: nft delete table ${fam} ${t} failed"
    fi
  done
}
cleanup_netns() {
  local n
  for n in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    [[ "${n}" == cni-* ]] || continue
    state_has "netns-existed ${n}" && continue
    ip netns delete "${n}" 2>/dev/null || { umount -l "/run/netns/${n}" 2>/dev/null; rm -f "/run/netns/${n}"; }
  done
  # veths still attached to our bridge (their pod netns should be gone with the pods)
  for n in $(ip -o link show master "${BRIDGE}" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
    [[ "${n}" == veth* ]] && ip link delete "${n}" 2>/dev/null || true
  done
}
cleanup_mounts() { # everything mounted under our folders (pod volumes, sandbox shm, rootfs), deepest first
  local m d i found dirs=("${KUBELET_DIR}" "${NODE_DIR}" "${CTR_STATE}" "${CTR_ROOT}" "${RUN_DIR}")
  for ((i = 0; i < 3; i++)); do
    found=0
    while read -r m; do
      m="$(printf '%b' "${m}")"  # /proc/mounts writes a space as \040
      for d in "${dirs[@]}"; do
        if [[ "${m}" == "${d}" || "${m}" == "${d}/"* ]]; then
          umount "${m}" 2>/dev/null || umount -l "${m}" 2>/dev/null || true; found=1; break
        fi
      done
    done < <(awk '{print $2}' /proc/mounts | sort -r)
    ((found)) || break
  done
}
cleanup_cgroups() {
  local d
  kill_cgroup_procs
  sleep 0.3
  while read -r d; do rmdir "${d}" 2>/dev/null || log "WARNING: cgroup ${d} not removable"; done \
    < <(find /sys/fs/cgroup/*/kubepods* -depth -type d 2>/dev/null)
}
cleanup_api_objects() {
  kc get --raw /readyz >/dev/null 2>&1 || return 0
  kc delete node "${NODE_NAME}" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  coredns_manifests | kc delete --ignore-not-found --wait=false -f - >/dev/null 2>&1 || true
}
cmd_down() {
  [[ "$(id -u)" == 0 ]] || die "needs root"
  local o; o="$(owner)"
  if [[ -n "${o}" && "${o}" != "${CLUSTER_DIR}" ]]; then
    log "the real node on this machine belongs to ${o}, not ${CLUSTER_DIR}: nothing to do"; return 0
  fi
  if [[ -z "${o}" && ! -f "${HOST_STATE}" && "${RLP_NODE_FORCE:-0}" != 1 ]]; then
    log "no real node was brought up for ${CLUSTER_DIR}: nothing to do (RLP_NODE_FORCE=1 cleans up anyway)"; return 0
  fi
  load_tools
  local t=${SECONDS}
  stop_daemon kubelet 20
  stop_daemon coredns
  stop_daemon kube-proxy
  stop_containers
  stop_daemon containerd 20
  local p; for p in $(our_shims); do kill -KILL "${p}" 2>/dev/null || true; done
  kill_cgroup_procs
  remove_shim_sockets
  cleanup_api_objects
  if [[ -x "${KUBE_PROXY}" ]]; then "${KUBE_PROXY}" --cleanup --v=0 >>"${LOGS}/kube-proxy.log" 2>&1 || true; fi
  cleanup_iptables iptables
  cleanup_iptables ip6tables
  command -v conntrack >/dev/null && { conntrack -D -s 198.18.0.0/15 >/dev/null 2>&1 || true; conntrack -D -d 198.18.0.0/15 >/dev/null 2>&1 || true; }
  cleanup_netns
  cleanup_mounts
  cleanup_cgroups
  restore_host_state
  # Files: our per-run folders, then the host paths that did not exist before up.
  rm -rf "${NODE_DIR}" "${CTR_STATE}" "${RUNC_ROOT}"
  if [[ "${KEEP_IMAGES}" == 0 ]]; then rm -rf "${CTR_ROOT}"
  else rm -rf "${CTR_ROOT}/io.containerd.grpc.v1.cri/sandboxes" "${CTR_ROOT}/io.containerd.grpc.v1.cri/containers"; fi
  local path
  for path in "${HOST_PATHS[@]}"; do
    [[ -e "${path}" ]] || continue
    [[ -f "${HOST_STATE}" ]] && state_has "path-existed ${path}" && continue
    [[ -f "${HOST_STATE}" ]] || case "${path}" in /run/containerd|/run/containerd/s|/var/lib/containerd|/opt/containerd) continue ;; esac
    case "${path}" in
      /run/containerd|/run/containerd/s) rmdir "${path}/s" "${path}" 2>/dev/null || true ;;  # shared with Docker's containerd: only when empty
      *) rm -rf "${path}" ;;
    esac
  done
  rm -f "${HOST_STATE}" "${OWNER_FILE}" "${PIDS}"/{containerd,kubelet,kube-proxy,coredns}.pid
  rmdir "${RUN_DIR}" 2>/dev/null || true
  log "node down in $((SECONDS - t))s$([[ "${KEEP_IMAGES}" != 0 ]] && echo "; kept the image store ${CTR_ROOT} ($(du -sh "${CTR_ROOT}" 2>/dev/null | cut -f1))")"
}

# ------------------------------------------------------------------------------------------------------- status
cmd_status() {
  set +e
  load_tools
  local s
  line() { printf '%-11s %s\n' "$1" "$2"; }
  if alive containerd; then
    s="running pid $(pid_of containerd)"; containerd_ok && s+=", answers on ${CTR_SOCK}" || s+=", NOT answering"
    line containerd "${s}"
    local imgs; imgs="$(ctr_ images ls -q 2>/dev/null | grep -v '^sha256:' | tr '\n' ' ')"
    line images "${imgs:-none}"
  else line containerd "stopped"; line images "(containerd stopped; store ${CTR_ROOT})"; fi
  if [[ -f "${CNI_CONF_DIR}/10-${CNI_NET_NAME}.conflist" ]]; then s="conf ${CNI_CONF_DIR}"; else s="no conf"; fi
  iptables -t filter -C FORWARD -j "${FW_CHAIN}" 2>/dev/null && s+=", ${FW_CHAIN} in FORWARD" || s+=", no ${FW_CHAIN}"
  line cni "${s}"
  for s in kubelet:"http://127.0.0.1:${KUBELET_HEALTHZ_PORT}/healthz" kube-proxy:"http://127.0.0.1:${PROXY_HEALTHZ_PORT}/livez" \
           coredns:"http://127.0.0.1:${COREDNS_READY_PORT}/ready"; do
    local name="${s%%:*}" url="${s#*:}"
    if alive "${name}"; then
      line "${name}" "running pid $(pid_of "${name}"), $(http_ok "${url}" && echo healthy || echo "NOT healthy (${url})")"
    else line "${name}" "stopped"; fi
  done
  if [[ -s "${KUBECONFIG_ADMIN}" ]] && node_ready 2>/dev/null; then line node "${NODE_NAME} Ready"
  else line node "${NODE_NAME} not Ready (or no apiserver)"; fi
  line host-state "$([[ -f "${HOST_STATE}" ]] && echo "recorded in ${HOST_STATE}" || echo "none (node down)")"
}

# ------------------------------------------------------------------------------------------------------- snapshot
cmd_host_snapshot() {
  set +e +o pipefail
  local bin c
  echo "## sysctl (volatile counters left out)"
  sysctl -a 2>/dev/null | grep -Ev '^(fs\.(dentry-state|file-nr|inode-nr|inode-state|aio-nr|quota\.)|kernel\.(ns_last_pid|random\.|pty\.nr|perf_event_max_sample_rate)|net\.netfilter\.nf_conntrack_count)' | sort
  echo "conntrack-hashsize $(cat /sys/module/nf_conntrack/parameters/hashsize 2>/dev/null)"
  for bin in iptables ip6tables; do
    echo "## ${bin}-save (counters zeroed)"
    command -v "${bin}-save" >/dev/null && "${bin}-save" 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]/[0:0]/'
  done
  echo "## links (carrier of ${BRIDGE} left out: a port-less bridge reports NO-CARRIER once it has had ports)"
  ip -o link show | sed -E 's/^[0-9]+: //; s/@if[0-9]+//; s/ qlen [0-9]+//; s/ +link\/.*//' \
    | sed -E "/^${BRIDGE}: /{s/NO-CARRIER,//; s/,LOWER_UP//; s/ state [A-Z]+ / state * /}" | sort
  echo "## addresses"
  ip -o addr show | awk '{print $2, $3, $4}' | sort
  echo "## routes"
  { ip -4 route show table all; ip -6 route show table all; } 2>/dev/null | sed -E 's/ linkdown//' | sort
  echo "## netns"
  ip netns list 2>/dev/null | sort
  echo "## mounts"
  awk '{print $1, $2, $3}' /proc/mounts | sort
  echo "## cgroups (kubepods*, and each hierarchy's top level)"
  for c in /sys/fs/cgroup/*/; do find "${c}" -mindepth 1 -maxdepth 1 -type d 2>/dev/null; done | sort
  find /sys/fs/cgroup/*/kubepods* -type d 2>/dev/null | sort
  echo "## files"
  local p
  for p in "${HOST_PATHS[@]}" "${NODE_DIR}" "${CTR_STATE}" "${HOST_STATE}"; do
    if [[ -e "${p}" ]]; then echo "${p} exists: $(ls -A "${p}" 2>/dev/null | sort | tr '\n' ' ')"; else echo "${p} absent"; fi
  done
  echo "## processes (ours: kubelet, kube-proxy, coredns, containerd shims of ${CTR_SOCK}, containerd on ${CTR_SOCK})"
  pgrep -x kubelet >/dev/null && echo "kubelet $(pgrep -x kubelet | wc -l)"
  pgrep -x kube-proxy >/dev/null && echo "kube-proxy $(pgrep -x kube-proxy | wc -l)"
  pgrep -x coredns >/dev/null && echo "coredns $(pgrep -x coredns | wc -l)"
  pgrep -f -- "containerd --config ${NODE_DIR}/containerd.toml" >/dev/null && echo "containerd (ours) running"
  local shims; shims="$(our_shims | wc -l)"; ((shims)) && echo "containerd shims (ours) ${shims}"
  echo "## listening sockets of those processes"
  ss -Hlntup 2>/dev/null | grep -E '"(kubelet|kube-proxy|coredns)"' | awk '{print $1, $5}' | sort
  return 0
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  host-snapshot) cmd_host_snapshot ;;
  # The host packages `up` installs when missing (apt), alone: the tests install them before photographing the host,
  # so that a package's own files and firewall (nftables' /etc/nftables.conf, and `nft` then listing Docker's rules)
  # are part of the picture rather than counted as the cluster's leftovers.
  packages) ensure_packages ;;
  *) echo "usage: $0 up|down|status|host-snapshot|packages" >&2; exit 2 ;;
esac
