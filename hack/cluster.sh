#!/usr/bin/env bash
# The local Kubernetes cluster tier, built from registry sources (Go module proxy, Debian apt) and cached by version
# outside the repo (hack/tools.sh). `make cluster-up|cluster-down|cluster-status`.
#
#   hack/cluster.sh up [--level a|b]   a: control plane + KubeRay operator + Kueue + KWOK fake nodes (a CPU rollout pool and a
#                                         GPU learner node). Placement is real (scheduler, operator); pods are not.
#                                      b: (default) the same control plane, this machine as one real node
#                                         (hack/cluster/node.sh: containerd, kubelet, kube-proxy, CoreDNS) for the
#                                         CPU pods, and a KWOK GPU node (no GPU here; a learner can't run on it).
#   hack/cluster.sh down               stop everything `up` started and undo every host change
#   hack/cluster.sh status             one line per component; exit 0 when the API server answers
#   hack/cluster.sh env                the `export KUBECONFIG=... PATH=...` line
#
# Control plane: etcd on 127.0.0.1, kube-apiserver on the node bridge address (the kubelet refuses a loopback node IP
# and the apiserver a loopback `kubernetes` Service endpoint), controller-manager, scheduler and the KubeRay operator
# (out of cluster, its own ClusterRole, `--use-kubernetes-proxy`), kwok for fake nodes. Addresses: hack/cluster/common.sh.
# `up` is idempotent: a component already running and healthy is left alone. It ends by printing one line to `eval`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/cluster/common.sh
source "${ROOT}/hack/cluster/common.sh"
eval "$("${ROOT}/hack/tools.sh" env | sed 's/^/export /')"
KUBECTL="${K8S_BIN}/kubectl"
# Fake nodes: a CPU rollout pool (Level A only) and GPU learner nodes, labelled and tainted as the chart expects.
FAKE_CPU_NODES="${RLP_FAKE_CPU_NODES:-2}"
FAKE_GPU_NODES="${RLP_FAKE_GPU_NODES:-1}"
OPERATOR_METRICS_ADDR="127.0.0.1:${RLP_OPERATOR_METRICS_PORT:-18080}"
OPERATOR_PROBE_ADDR="127.0.0.1:${RLP_OPERATOR_PROBE_PORT:-18081}"
# Kueue's manager: every port on loopback (the API server calls its webhooks at 127.0.0.1, TLS from our CA).
KUEUE_WEBHOOK_PORT="${RLP_KUEUE_WEBHOOK_PORT:-19443}"
KUEUE_METRICS_ADDR="127.0.0.1:${RLP_KUEUE_METRICS_PORT:-18082}"
KUEUE_PROBE_ADDR="127.0.0.1:${RLP_KUEUE_PROBE_PORT:-18083}"

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { printf 'cluster: %s\n' "$*" >&2; exit 1; }
kc() { "${KUBECTL}" --kubeconfig "${KUBECONFIG_ADMIN}" "$@"; }

# ---------------------------------------------------------------------------------------------------------------
# processes: each daemon runs in its own session, pid in ${PIDS}/NAME.pid, output in ${LOGS}/NAME.log
running() { local p; p="$(cat "${PIDS}/$1.pid" 2>/dev/null)" && [[ -n "${p}" ]] && kill -0 "${p}" 2>/dev/null; }
start() { # start NAME CMD...
  local name="$1"; shift
  running "${name}" && return 0
  mkdir -p "${LOGS}" "${PIDS}"
  setsid nohup "$@" >>"${LOGS}/${name}.log" 2>&1 < /dev/null &
  echo $! > "${PIDS}/${name}.pid"
}
stop() { # stop NAME: SIGTERM, then SIGKILL after 10 s
  local name="$1" p i
  p="$(cat "${PIDS}/${name}.pid" 2>/dev/null)" || return 0
  if [[ -n "${p}" ]] && kill -0 "${p}" 2>/dev/null; then
    kill -TERM "${p}" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do kill -0 "${p}" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "${p}" 2>/dev/null || true
  fi
  rm -f "${PIDS}/${name}.pid"
}
# wait_for WHAT SECONDS CMD...: poll CMD until it succeeds; on timeout name WHAT and show the end of its log
wait_for() {
  local what="$1" secs="$2" deadline; shift 2
  deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "${what} not ready after ${secs}s; last lines of ${LOGS}/${what}.log:"
      tail -n 20 "${LOGS}/${what}.log" >&2 2>/dev/null || true
      die "${what} did not become ready"
    fi
    running "${what}" || { tail -n 30 "${LOGS}/${what}.log" >&2 2>/dev/null || true; die "${what} exited (log: ${LOGS}/${what}.log)"; }
    sleep 0.5
  done
}

# ---------------------------------------------------------------------------------------------------------------
# host network: the node bridge (the only host change the control plane makes)
bridge_up() {
  if ! ip link show "${BRIDGE}" >/dev/null 2>&1; then
    ip link add "${BRIDGE}" type bridge
    touch "${CLUSTER_DIR}/bridge-created"
  fi
  ip addr replace "${NODE_IP}/${NODE_CIDR#*/}" dev "${BRIDGE}"
  ip link set "${BRIDGE}" up
}
bridge_down() {
  if [[ -f "${CLUSTER_DIR}/bridge-created" ]] && ip link show "${BRIDGE}" >/dev/null 2>&1; then
    ip link set "${BRIDGE}" down || true
    ip link del "${BRIDGE}"
  fi
}

# ---------------------------------------------------------------------------------------------------------------
# PKI: one CA; every component a client certificate named by its Kubernetes identity
cert() { # cert NAME CN [O] [SANS]: ${PKI}/NAME.{key,crt} signed by the CA (kept when present)
  local name="$1" cn="$2" o="${3:-}" sans="${4:-}" subj
  [[ -s "${PKI}/${name}.crt" ]] && return 0
  subj="/CN=${cn}"; [[ -n "${o}" ]] && subj="/O=${o}${subj}"
  openssl genrsa -out "${PKI}/${name}.key" 2048 2>/dev/null
  openssl req -new -key "${PKI}/${name}.key" -subj "${subj}" -out "${PKI}/${name}.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [[ -n "${sans}" ]]; then echo "extendedKeyUsage=serverAuth,clientAuth"; echo "subjectAltName=${sans}"
    else echo "extendedKeyUsage=clientAuth"; fi
  } > "${PKI}/${name}.ext"
  openssl x509 -req -in "${PKI}/${name}.csr" -CA "${PKI}/ca.crt" -CAkey "${PKI}/ca.key" -CAcreateserial \
    -days 365 -sha256 -extfile "${PKI}/${name}.ext" -out "${PKI}/${name}.crt" 2>/dev/null
  rm -f "${PKI}/${name}.csr" "${PKI}/${name}.ext"
}
kubeconfig() { # kubeconfig NAME CERT: ${CLUSTER_DIR}/NAME.kubeconfig for the client certificate CERT
  local out="${CLUSTER_DIR}/$1.kubeconfig" c="$2"
  [[ -s "${out}" ]] && return 0
  cat > "${out}" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: rl-platform-local
  cluster:
    server: ${APISERVER_URL}
    certificate-authority-data: $(base64 -w0 < "${PKI}/ca.crt")
users:
- name: $1
  user:
    client-certificate-data: $(base64 -w0 < "${PKI}/${c}.crt")
    client-key-data: $(base64 -w0 < "${PKI}/${c}.key")
contexts:
- name: rl-platform-local
  context: {cluster: rl-platform-local, user: $1, namespace: ${NAMESPACE}}
current-context: rl-platform-local
EOF
  chmod 600 "${out}"
}
pki() {
  mkdir -p "${PKI}"; chmod 700 "${PKI}"
  if [[ ! -s "${PKI}/ca.crt" ]]; then
    openssl genrsa -out "${PKI}/ca.key" 2048 2>/dev/null
    openssl req -x509 -new -key "${PKI}/ca.key" -subj "/CN=rl-platform-local-ca" -days 365 -sha256 \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
      -out "${PKI}/ca.crt" 2>/dev/null
  fi
  local svc="kubernetes.default.svc.${CLUSTER_DOMAIN}"
  cert apiserver kube-apiserver "" \
    "IP:${NODE_IP},IP:${KUBERNETES_SVC_IP},IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:${svc},DNS:localhost"
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
  cert admin rl-platform-admin system:masters
  cert controller-manager system:kube-controller-manager
  cert scheduler system:kube-scheduler
  cert kubelet "system:node:${NODE_NAME}" system:nodes
  cert kube-proxy system:kube-proxy
  cert kuberay-operator kuberay-operator
  cert kwok kwok-controller
  cert kueue kueue
  cert kueue-webhook kueue-webhook "" "IP:127.0.0.1,DNS:localhost"
  if [[ ! -s "${PKI}/sa.key" ]]; then
    openssl genrsa -out "${PKI}/sa.key" 2048 2>/dev/null
    openssl rsa -in "${PKI}/sa.key" -pubout -out "${PKI}/sa.pub" 2>/dev/null
  fi
  kubeconfig admin admin
  kubeconfig controller-manager controller-manager
  kubeconfig scheduler scheduler
  kubeconfig kubelet kubelet
  kubeconfig kube-proxy kube-proxy
  kubeconfig kuberay-operator kuberay-operator
  kubeconfig kwok kwok
  kubeconfig kueue kueue
  # The one directory a user puts on PATH: the built kubectl and helm.
  mkdir -p "${CLUSTER_DIR}/bin"
  ln -sfn "${KUBECTL}" "${CLUSTER_DIR}/bin/kubectl"
  ln -sfn "${HELM}" "${CLUSTER_DIR}/bin/helm"
}

# ---------------------------------------------------------------------------------------------------------------
# control plane
apiserver_ready() {
  curl -fsS --max-time 2 --cacert "${PKI}/ca.crt" --cert "${PKI}/admin.crt" --key "${PKI}/admin.key" \
    "${APISERVER_URL}/readyz" >/dev/null
}
control_plane() {
  start etcd "${ETCD}" --name rl-platform --data-dir "${CLUSTER_DIR}/etcd" \
    --listen-client-urls "http://127.0.0.1:${ETCD_CLIENT_PORT}" --advertise-client-urls "http://127.0.0.1:${ETCD_CLIENT_PORT}" \
    --listen-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" --initial-advertise-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
    --initial-cluster "rl-platform=http://127.0.0.1:${ETCD_PEER_PORT}" --listen-metrics-urls "" \
    --quota-backend-bytes $((2 * 1024 * 1024 * 1024)) --log-level warn
  wait_for etcd 60 curl -fsS --max-time 2 "http://127.0.0.1:${ETCD_CLIENT_PORT}/health"

  start kube-apiserver "${K8S_BIN}/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:${ETCD_CLIENT_PORT}" \
    --bind-address "${NODE_IP}" --advertise-address "${NODE_IP}" --secure-port "${APISERVER_PORT}" \
    --tls-cert-file "${PKI}/apiserver.crt" --tls-private-key-file "${PKI}/apiserver.key" \
    --client-ca-file "${PKI}/ca.crt" --anonymous-auth=false \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --service-cluster-ip-range "${SERVICE_CIDR}" \
    --service-account-issuer "https://kubernetes.default.svc.${CLUSTER_DOMAIN}" \
    --service-account-key-file "${PKI}/sa.pub" --service-account-signing-key-file "${PKI}/sa.key" \
    --kubelet-client-certificate "${PKI}/apiserver-kubelet-client.crt" --kubelet-client-key "${PKI}/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "${PKI}/ca.crt" --kubelet-preferred-address-types InternalIP \
    --allow-privileged=true --profiling=false --event-ttl 1h
  wait_for kube-apiserver 180 apiserver_ready

  start kube-controller-manager "${K8S_BIN}/kube-controller-manager" \
    --kubeconfig "${CLUSTER_DIR}/controller-manager.kubeconfig" \
    --authentication-kubeconfig "${CLUSTER_DIR}/controller-manager.kubeconfig" \
    --authorization-kubeconfig "${CLUSTER_DIR}/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "${CONTROLLER_MANAGER_PORT}" --leader-elect=false --profiling=false --cluster-name rl-platform \
    --service-cluster-ip-range "${SERVICE_CIDR}" --allocate-node-cidrs=false \
    --root-ca-file "${PKI}/ca.crt" --service-account-private-key-file "${PKI}/sa.key" \
    --use-service-account-credentials=true --flex-volume-plugin-dir "${CLUSTER_DIR}/flexvolume" \
    --cluster-signing-cert-file "${PKI}/ca.crt" --cluster-signing-key-file "${PKI}/ca.key"
  start kube-scheduler "${K8S_BIN}/kube-scheduler" \
    --kubeconfig "${CLUSTER_DIR}/scheduler.kubeconfig" \
    --authentication-kubeconfig "${CLUSTER_DIR}/scheduler.kubeconfig" \
    --authorization-kubeconfig "${CLUSTER_DIR}/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "${SCHEDULER_PORT}" --leader-elect=false --profiling=false
  wait_for kube-controller-manager 120 curl -fsSk --max-time 2 "https://127.0.0.1:${CONTROLLER_MANAGER_PORT}/healthz"
  wait_for kube-scheduler 120 curl -fsSk --max-time 2 "https://127.0.0.1:${SCHEDULER_PORT}/healthz"
  # The default ServiceAccount appears once the controller-manager runs: ServiceAccount tokens work from here on.
  wait_for kube-controller-manager 60 kc -n default get serviceaccount default
}

# kc_wait SECONDS ARGS...: `kubectl wait ARGS` until it succeeds or SECONDS pass. kubectl wait fails at once
# (".status.conditions accessor error") on an object that has no conditions yet (a node kwok has not reported, a CRD
# just created), so one call is not enough.
kc_wait() {
  local deadline=$((SECONDS + $1)); shift
  until kc wait --timeout 5s "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 1
  done
}

# KubeRay: CRDs server-side, the operator's own ClusterRole (from the same module), operator out of cluster.
kuberay() {
  local src
  src="$(cd "${KUBERAY_CRDS}/.." && pwd)"
  kc apply --server-side --force-conflicts -f "${KUBERAY_CRDS}" >/dev/null
  kc_wait 60 --for condition=Established crd/rayclusters.ray.io crd/rayjobs.ray.io crd/rayservices.ray.io ||
    die "the KubeRay CRDs were not Established in 60s"
  if [[ ! -s "${src}/rbac/role.yaml" ]]; then  # the ClusterRole ships in the module next to the CRDs
    local mod; mod="$(GOMODCACHE="${RLP_CACHE:-${HOME}/.cache/rl-platform}/go/mod" go mod download -json "github.com/ray-project/kuberay/ray-operator@v$(cat "${src}/VERSION")" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
    mkdir -p "${src}/rbac.tmp"; cp "${mod}/config/rbac/role.yaml" "${src}/rbac.tmp/"; chmod -R u+w "${src}/rbac.tmp"
    mv "${src}/rbac.tmp" "${src}/rbac"
  fi
  # The upstream role is named manager-role (kustomize prefixes it); bind it to the operator's certificate identity.
  sed 's/^  name: manager-role$/  name: kuberay-operator/' "${src}/rbac/role.yaml" | kc apply --server-side -f - >/dev/null
  kc create clusterrolebinding kuberay-operator --clusterrole kuberay-operator --user kuberay-operator \
    --dry-run=client -o yaml | kc apply --server-side -f - >/dev/null
  start kuberay-operator "${KUBERAY_OPERATOR}" --kubeconfig "${CLUSTER_DIR}/kuberay-operator.kubeconfig" \
    --metrics-addr "${OPERATOR_METRICS_ADDR}" --health-probe-bind-address "${OPERATOR_PROBE_ADDR}" \
    --enable-leader-election=false --use-kubernetes-proxy --log-stdout-encoder console
  wait_for kuberay-operator 60 curl -fsS --max-time 2 "http://${OPERATOR_PROBE_ADDR}/readyz"
}

# Kueue (queues, quotas, priorities for RayJobs): CRDs server-side, the manager's own ClusterRole bound to its
# certificate identity, the manager out of cluster with only the ray.io/rayjob integration (a RayJob is queued only
# when it carries the kueue.x-k8s.io/queue-name label; others are left alone). Its admission webhooks are registered
# by URL on 127.0.0.1 with our CA (no Service, no in-cluster certificate rotation), and only those its own objects
# and that integration need: no webhook that pod or Deployment creation would depend on.
KUEUE_WEBHOOKS=( # TYPE PATH-SUFFIX GROUP VERSION RESOURCE OPERATIONS (/mutate-<suffix>, /validate-<suffix>)
  "m kueue-x-k8s-io-v1beta2-clusterqueue kueue.x-k8s.io v1beta2 clusterqueues CREATE"
  "m kueue-x-k8s-io-v1beta2-resourceflavor kueue.x-k8s.io v1beta2 resourceflavors CREATE"
  "m kueue-x-k8s-io-v1beta2-workload kueue.x-k8s.io v1beta2 workloads CREATE"
  "m ray-io-v1-rayjob ray.io v1 rayjobs CREATE"
  "v kueue-x-k8s-io-v1beta2-clusterqueue kueue.x-k8s.io v1beta2 clusterqueues CREATE,UPDATE"
  "v kueue-x-k8s-io-v1beta2-cohort kueue.x-k8s.io v1beta2 cohorts CREATE,UPDATE"
  "v kueue-x-k8s-io-v1beta2-resourceflavor kueue.x-k8s.io v1beta2 resourceflavors CREATE,UPDATE"
  "v kueue-x-k8s-io-v1beta2-workload kueue.x-k8s.io v1beta2 workloads CREATE,UPDATE"
  "v ray-io-v1-rayjob ray.io v1 rayjobs CREATE,UPDATE"
)
kueue_webhooks() { # the Mutating- and ValidatingWebhookConfiguration, as YAML
  local t kind prefix entry type suffix group version resource ops ca
  ca="$(base64 -w0 < "${PKI}/ca.crt")"
  for t in m v; do
    if [[ "${t}" == m ]]; then kind=MutatingWebhookConfiguration prefix=mutate; else kind=ValidatingWebhookConfiguration prefix=validate; fi
    printf -- '---\napiVersion: admissionregistration.k8s.io/v1\nkind: %s\nmetadata:\n  name: rl-platform-kueue\nwebhooks:\n' "${kind}"
    for entry in "${KUEUE_WEBHOOKS[@]}"; do
      read -r type suffix group version resource ops <<<"${entry}"
      [[ "${type}" == "${t}" ]] || continue
      cat <<EOF
- name: ${t}${resource%s}.kueue.x-k8s.io
  admissionReviewVersions: [v1]
  clientConfig:
    url: https://127.0.0.1:${KUEUE_WEBHOOK_PORT}/${prefix}-${suffix}
    caBundle: ${ca}
  failurePolicy: Fail
  sideEffects: None
  timeoutSeconds: 10
  rules:
  - apiGroups: [${group}]
    apiVersions: [${version}]
    operations: [${ops//,/, }]
    resources: [${resource}]
EOF
    done
  done
}
kueue() {
  local dir="${CLUSTER_DIR}/kueue"
  mkdir -p "${dir}/certs"
  install -m 600 "${PKI}/kueue-webhook.crt" "${dir}/certs/tls.crt"
  install -m 600 "${PKI}/kueue-webhook.key" "${dir}/certs/tls.key"
  kc create namespace kueue-system --dry-run=client -o yaml | kc apply --server-side -f - >/dev/null
  kc apply --server-side --force-conflicts -f "${KUEUE_CRDS}" >/dev/null
  kc_wait 60 --for condition=Established crd/clusterqueues.kueue.x-k8s.io crd/localqueues.kueue.x-k8s.io \
    crd/resourceflavors.kueue.x-k8s.io crd/workloads.kueue.x-k8s.io crd/workloadpriorityclasses.kueue.x-k8s.io ||
    die "the Kueue CRDs were not Established in 60s"
  # The upstream roles (kustomize prefixes their names and sets the namespace): the manager's ClusterRole and its
  # Role on Secrets in its own namespace, bound to its certificate identity.
  sed 's/^  name: manager-role$/  name: kueue-manager/' "${KUEUE_RBAC}/role.yaml" | kc apply --server-side -f - >/dev/null
  sed -e 's/^  name: manager-secrets-role$/  name: kueue-manager-secrets/' -e 's/^  namespace: system$/  namespace: kueue-system/' \
    "${KUEUE_RBAC}/manager_secrets_role.yaml" | kc apply --server-side -f - >/dev/null
  kc create clusterrolebinding kueue-manager --clusterrole kueue-manager --user kueue \
    --dry-run=client -o yaml | kc apply --server-side -f - >/dev/null
  kc -n kueue-system create rolebinding kueue-manager-secrets --role kueue-manager-secrets --user kueue \
    --dry-run=client -o yaml | kc apply --server-side -f - >/dev/null
  cat > "${dir}/config.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
manageJobsWithoutQueueName: false
health:
  healthProbeBindAddress: ${KUEUE_PROBE_ADDR}
metrics:
  bindAddress: ${KUEUE_METRICS_ADDR}
webhook:
  host: 127.0.0.1
  port: ${KUEUE_WEBHOOK_PORT}
  certDir: ${dir}/certs
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
featureGates:
  VisibilityOnDemand: false   # its aggregated API server wants certificates at /visibility (a pod's mount)
integrations:
  frameworks: ["ray.io/rayjob"]
EOF
  # Kueue reads its metrics-server certificate from the fixed path a pod would mount (/etc/kueue/metrics/certs, no
  # flag): it runs in a private mount namespace whose /etc is an overlay adding that folder, so the host's /etc is
  # never written.
  mkdir -p "${dir}/etc/upper/kueue/metrics/certs" "${dir}/etc/work"
  cp "${dir}/certs/tls.crt" "${dir}/certs/tls.key" "${dir}/etc/upper/kueue/metrics/certs/"
  # shellcheck disable=SC2016  # expanded by the inner shell
  start kueue unshare --mount --propagation private sh -c \
    'mount -t overlay rlp-kueue-etc -o "lowerdir=/etc,upperdir=$0/upper,workdir=$0/work" /etc && shift && exec "$@"' \
    "${dir}/etc" x "${KUEUE}" --config "${dir}/config.yaml" --kubeconfig "${CLUSTER_DIR}/kueue.kubeconfig"
  wait_for kueue 90 curl -fsS --max-time 2 "http://${KUEUE_PROBE_ADDR}/readyz"
  kueue_webhooks | kc apply --server-side --force-conflicts -f - >/dev/null
}

# kwok manages only nodes annotated kwok.x-k8s.io/node=fake (never the real kubelet's node). Its pod IPs are fake
# addresses from the node bridge range; its own server (logs/exec) stays off.
kwok_up() {
  kc apply --server-side -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kwok-controller}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: kwok-controller}]
EOF
  start kwok "${KWOK}" --kubeconfig "${CLUSTER_DIR}/kwok.kubeconfig" --config "${KWOK_STAGES}" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --node-ip 198.18.0.2 --cidr 198.18.64.0/18 --node-lease-duration-seconds 40
  wait_for kwok 30 running kwok
}
fake_node() { # fake_node NAME POOL CPU MEMORY GPUS
  local name="$1" pool="$2" cpu="$3" mem="$4" gpus="$5" taints="" gpu_cap=""
  if ((gpus > 0)); then
    taints="  taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]"
    gpu_cap="    nvidia.com/gpu: \"${gpus}\""
  fi
  kc apply --server-side --force-conflicts -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: ${name}
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels:
    type: kwok
    kubernetes.io/hostname: ${name}
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    rl-platform.io/pool: ${pool}
    rl-platform.io/node: fake
$( ((gpus > 0)) && printf '    nvidia.com/gpu.present: "true"\n')
spec:
${taints}
status:
  allocatable: {cpu: "${cpu}", memory: ${mem}, pods: "110"}
  capacity: {cpu: "${cpu}", memory: ${mem}, pods: "110"}
EOF
  if ((gpus > 0)); then  # extended resources go in through the status subresource, as a device plugin would
    kc patch node "${name}" --subresource status --type merge \
      -p "{\"status\":{\"capacity\":{\"nvidia.com/gpu\":\"${gpus}\"},\"allocatable\":{\"nvidia.com/gpu\":\"${gpus}\"}}}" >/dev/null
  fi
}
fake_nodes() { # fake_nodes LEVEL
  local i
  for ((i = 0; i < FAKE_GPU_NODES; i++)); do fake_node "fake-learner-gpu-${i}" gpu 8 64Gi 1; done
  if [[ "$1" == a ]]; then
    for ((i = 0; i < FAKE_CPU_NODES; i++)); do fake_node "fake-rollout-cpu-${i}" cpu 8 32Gi 0; done
  else  # Level B: CPU pods go to the real node only; pods bound to the fake CPU nodes go with them (their owners
        # recreate them on the real node). The node goes first: a pod deleted while its node still exists can be
        # recreated and bound to that node again before the node disappears.
    local n
    for n in $(kc get node -l rl-platform.io/node=fake,rl-platform.io/pool=cpu -o name); do
      kc cordon "${n#node/}" >/dev/null 2>&1 || true
      kc delete "${n}" --ignore-not-found --wait >/dev/null
      kc delete pods -A --field-selector "spec.nodeName=${n#node/}" --force --grace-period=0 >/dev/null 2>&1 || true
    done
  fi
  kc_wait 60 --for condition=Ready node -l rl-platform.io/node=fake ||
    die "kwok did not make the fake nodes Ready in 60s (log: ${LOGS}/kwok.log)"
}

# ---------------------------------------------------------------------------------------------------------------
env_line() {
  printf 'export KUBECONFIG=%s PATH=%s:$PATH\n' "${KUBECONFIG_ADMIN}" "${CLUSTER_DIR}/bin"
}

up() {
  local level=b t0=${SECONDS} t
  while (($#)); do case "$1" in --level) level="$2"; shift 2 ;; --level=*) level="${1#*=}"; shift ;;
    *) die "unknown argument '$1' (usage: $0 up [--level a|b])" ;; esac; done
  [[ "${level}" == a || "${level}" == b ]] || die "--level must be a or b, not '${level}'"
  [[ "$(id -u)" == 0 ]] || die "needs root: it creates the node bridge ${BRIDGE}${level/b/ and runs a kubelet}"
  command -v openssl >/dev/null || die "openssl is required"
  # helm and part a of the cluster binaries for Level A, part b (the real node's) too for Level B: make test's cold
  # layout starts Level A while part b builds, Level B while the PodMonitor tests' Prometheus and the GPU image do.
  local phases=(helm cluster-a); [[ "${level}" == b ]] && phases+=(cluster-b)
  t=${SECONDS}; "${ROOT}/hack/tools.sh" "${phases[@]}"; log "tools ready in $((SECONDS - t))s"
  mkdir -p "${CLUSTER_DIR}" "${LOGS}" "${PIDS}"
  t=${SECONDS}; bridge_up; pki; control_plane; log "control plane ready in $((SECONDS - t))s"
  t=${SECONDS}; kuberay; kueue; kwok_up; log "KubeRay operator + Kueue + kwok ready in $((SECONDS - t))s"
  if [[ "${level}" == b ]]; then
    t=${SECONDS}; "${ROOT}/hack/cluster/node.sh" up; log "real node ready in $((SECONDS - t))s"
  fi
  fake_nodes "${level}"
  echo "${level}" > "${CLUSTER_DIR}/level"
  log "cluster up (level ${level}) in $((SECONDS - t0))s"
  env_line
}

down() {
  [[ -d "${CLUSTER_DIR}" ]] || { log "no cluster state at ${CLUSTER_DIR}: nothing to stop"; return 0; }
  if [[ -x "${ROOT}/hack/cluster/node.sh" ]]; then "${ROOT}/hack/cluster/node.sh" down || log "WARNING: node.sh down failed"; fi
  local c
  for c in kwok kueue kuberay-operator kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "${c}"; done
  bridge_down
  rm -rf "${CLUSTER_DIR}"
  log "cluster down: processes stopped, ${BRIDGE} removed, ${CLUSTER_DIR} deleted"
}

status() {
  local c rc=1
  for c in etcd kube-apiserver kube-controller-manager kube-scheduler kuberay-operator kueue kwok; do
    if running "${c}"; then printf '%-24s running (pid %s)\n' "${c}" "$(cat "${PIDS}/${c}.pid")"; else printf '%-24s stopped\n' "${c}"; fi
  done
  if [[ -s "${KUBECONFIG_ADMIN}" ]] && apiserver_ready 2>/dev/null; then
    rc=0
    printf '%-24s ready at %s (level %s)\n' "api" "${APISERVER_URL}" "$(cat "${CLUSTER_DIR}/level" 2>/dev/null || echo '?')"
    kc get nodes -L rl-platform.io/pool,rl-platform.io/node --no-headers 2>/dev/null | sed 's/^/node                     /'
  else
    printf '%-24s not answering\n' "api"
  fi
  [[ -x "${ROOT}/hack/cluster/node.sh" && -f "${CLUSTER_DIR}/level" && "$(cat "${CLUSTER_DIR}/level")" == b ]] &&
    "${ROOT}/hack/cluster/node.sh" status || true
  [[ "${rc}" == 0 ]] && env_line
  return "${rc}"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  status) status ;;
  env) env_line ;;
  *) echo "usage: $0 up [--level a|b] | down | status | env" >&2; exit 2 ;;
esac
