# Shared settings of the local cluster tier (sourced by hack/cluster.sh, hack/cluster/*.sh and, for the Docker bridge,
# hack/images.sh; not executable).
# Every address stays inside this machine. This machine class forbids traffic to the private ranges (10/8,
# 172.16/12, 192.168/16) even on local bridges, so the node bridge, pod and service ranges come from the
# benchmarking range 198.18.0.0/15. The kubelet refuses a loopback node IP and the apiserver refuses to publish a
# loopback address for the `kubernetes` Service, hence a bridge of our own.
# shellcheck shell=bash

RLP_ROOT="${RLP_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
RLP_CACHE="${RLP_CACHE:-${HOME}/.cache/rl-platform}"
# State of the running cluster (certs, kubeconfigs, etcd data, logs, pids). Not a cache: `cluster-down` removes it.
CLUSTER_DIR="${RLP_CLUSTER_DIR:-${RLP_CACHE}/cluster}"
PKI="${CLUSTER_DIR}/pki"
LOGS="${CLUSTER_DIR}/logs"
PIDS="${CLUSTER_DIR}/pids"
KUBECONFIG_ADMIN="${CLUSTER_DIR}/admin.kubeconfig"

BRIDGE="${RLP_BRIDGE:-rlp0}"              # the node bridge: node IP, apiserver, CoreDNS, and the CNI bridge for pods
NODE_IP="198.18.0.1"
NODE_CIDR="198.18.0.0/16"                 # on-link behind ${BRIDGE}
POD_RANGE_START="198.18.16.1"             # host-local IPAM hands pod IPs out of 198.18.16.0/20
POD_RANGE_END="198.18.31.254"
POD_CIDR="198.18.16.0/20"
SERVICE_CIDR="198.19.0.0/17"
# The Docker engine hack/images.sh starts (the containers suite's containers, published on 127.0.0.1): its default
# bridge and the pool user-defined networks draw from, in the other half of 198.19.0.0/16 (Docker's own default,
# 172.17.0.0/16, is a private range).
DOCKER_BRIDGE_IP="198.19.128.1/24"
DOCKER_ADDRESS_POOL="base=198.19.192.0/18,size=24"
KUBERNETES_SVC_IP="198.19.0.1"
DNS_SVC_IP="198.19.0.10"
CLUSTER_DOMAIN="cluster.local"
APISERVER_PORT="${RLP_APISERVER_PORT:-6443}"
APISERVER_URL="https://${NODE_IP}:${APISERVER_PORT}"
ETCD_CLIENT_PORT="${RLP_ETCD_PORT:-23790}"
ETCD_PEER_PORT="$((ETCD_CLIENT_PORT + 1))"
CONTROLLER_MANAGER_PORT="${RLP_CONTROLLER_MANAGER_PORT:-10257}"   # healthz, 127.0.0.1 only
SCHEDULER_PORT="${RLP_SCHEDULER_PORT:-10259}"                     # healthz, 127.0.0.1 only
NODE_NAME="rl-platform-node"              # the one real node (Level B): this machine
NAMESPACE="${K8S_NAMESPACE:-rl-platform}"
