# The local Kubernetes cluster tier (hack/cluster.sh): etcd, Kubernetes $(KUBERNETES_VERSION) and the KubeRay operator
# built from the Go module proxy, cached by version under $(RLP_CACHE)/tools. Needs root (a bridge, a kubelet).
# LEVEL=a: control plane + KubeRay + KWOK fake CPU/GPU nodes (placement only).
# LEVEL=b: the same plus this machine as one real node for the CPU pods (containerd, kubelet, kube-proxy, CoreDNS).
LEVEL ?= b

.PHONY: cluster-up cluster-down cluster-status cluster-tools test-k8s bench-k8s-scale

# The cluster tier runs where it can (root, Go): `make test` then builds its binaries in the background
# (TEST_BACKGROUND, mk/k8s.mk) and tests/k8s, which runs last, waits for them. Elsewhere tests/k8s skips with its reason.
ifeq ($(shell id -u),0)
ifneq ($(shell command -v go),)
CLUSTER_TIER := 1
endif
endif

cluster-tools: venv ## Build the cluster tier's binaries (etcd, Kubernetes, kwok, CoreDNS, KubeRay operator; cold ~20 min)
	@hack/tools.sh all cluster

cluster-up: venv ## Start the local cluster (LEVEL=a|b, default b) and print the `export KUBECONFIG=... PATH=...` line
	@hack/cluster.sh up --level $(LEVEL)

cluster-down: ## Stop the local cluster and undo every host change it made (keeps the build cache)
	@hack/cluster.sh down

cluster-status: ## One line per component of the local cluster
	@hack/cluster.sh status

test-k8s: venv ## Cluster-tier tests only: Level A (KWOK placement) and Level B (real pods), then cluster-down
	$(PY) -m pytest tests/k8s -m k8s $(PYTEST_ARGS)

SCALE_SIZES ?= 10,100,500
bench-k8s-scale: venv ## Placement at scale on KWOK nodes (SCALE_SIZES) -> bench/results/k8s_scale.json (needs cluster-up LEVEL=a)
	$(PY) bench/k8s_scale.py --sizes $(SCALE_SIZES)
