# Every host change the local cluster tier's real node (hack/cluster/node.sh) can make outside its own folders, in
# one place: node.sh records these before `up` and restores them in `down`, and the teardown test
# (tests/k8s/hostsnap.py) reads this same list (`host_changes_list`), so a change added here is both undone and
# checked. A new kind of change belongs here first. Sourced after hack/cluster/common.sh; not executable.
# shellcheck shell=bash

RUN_DIR="/run/rl-platform"                      # runtime state (tmpfs): short paths for unix sockets

# Sysctls the kubelet (setupKernelTunables), the CNI bridge plugin (isGateway: ip_forward), node.sh itself
# (ip_forward, the bridge's forwarding) or kube-proxy (only with settings we do not use: route_localnet, conntrack)
# may change. Per-bridge keys (net.ipv[46].{conf,neigh}.${BRIDGE}.*) are recorded as well.
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys
  kernel.keys.root_maxbytes net.ipv4.ip_forward net.ipv4.conf.all.forwarding net.ipv6.conf.all.forwarding
  net.ipv4.conf.all.route_localnet net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
  net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established
  net.netfilter.nf_conntrack_tcp_timeout_close_wait net.netfilter.nf_conntrack_tcp_be_liberal
  net.netfilter.nf_conntrack_udp_timeout net.netfilter.nf_conntrack_udp_timeout_stream)

# Host paths a kubelet/containerd/CNI may create outside our own folders (kubelet plugin and volume-plugin dirs
# included): `down` removes the ones that were absent before `up`.
HOST_PATHS=(/var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni /etc/cni /opt/cni /run/netns
  /run/containerd /run/containerd/s /etc/kubernetes /usr/libexec/kubernetes /var/lib/containerd /opt/containerd
  "${RUN_DIR}")

# Our daemons on the host (process names as /proc/PID/comm shows them): control plane (hack/cluster.sh; the KubeRay
# operator's binary is `ray-operator`, Kueue's manager `kueue`), the real node (node.sh), and what runs inside pods'
# sandboxes.
HOST_DAEMONS=(etcd kube-apiserver kube-controller-manager kube-scheduler ray-operator kueue kwok
  containerd containerd-shim-runc-v2 kubelet kube-proxy coredns pause)

# Also changed, by kind (each has its own cleanup in node.sh down / cluster.sh down): the bridge ${BRIDGE} and its
# addresses and routes, veths, iptables/ip6tables chains KUBE-* CNI-* and RLP-FORWARD (+ nft tables the iptables-nft
# backend creates), network namespaces cni-*, mounts under our folders, kubepods cgroups, conntrack entries of
# 198.18.0.0/15, the nf_conntrack hashsize.

host_changes_list() { # one "KIND VALUE" line per entry above: the test's copy of the list
  local x
  for x in "${SYSCTLS[@]}"; do echo "sysctl ${x}"; done
  for x in "${HOST_PATHS[@]}"; do echo "path ${x}"; done
  for x in "${HOST_DAEMONS[@]}"; do echo "daemon ${x}"; done
  echo "bridge ${BRIDGE}"
  echo "run-dir ${RUN_DIR}"
  echo "cluster-dir ${CLUSTER_DIR}"
  echo "ctr-root ${RLP_CTR_ROOT:-${RLP_CACHE}/containerd-root}"
}
