# Kubernetes half of rl-platform: tools, chart tests, rendered manifests, kind deployment.
# Versions live in mk/versions.mk only.
ifndef KUBERAY_VERSION
include $(dir $(lastword $(MAKEFILE_LIST)))versions.mk
endif

RLP_CACHE ?= $(HOME)/.cache/rl-platform
export RLP_CACHE
# `make deploy-cluster`: CLUSTER=local (the cluster tier of mk/cluster.mk, built here from registry sources) or
# kind (Docker + internet); auto picks kind when a `kind` is on PATH and Docker answers, else local.
# MONITORING=1 also installs kube-prometheus-stack (kind only).
CLUSTER ?= auto
KIND_CLUSTER ?= rl-platform
K8S_NAMESPACE ?= rl-platform
MONITORING ?= 0

# `make test` starts building what the later suites need in the background (hack/background.sh: one step after
# another, lowest CPU/IO priority) and goes straight on to pytest, whose Python-only suites run first (tests/conftest.py
# SUITE_ORDER). Each suite that needs a product asks its script for it (hack/tools.sh X, hack/images.sh build X),
# which waits for the background step on that script's lock and raises its priority, or builds it when that step failed.
# In the order the suites need them: the chart tools (quick; the unit suite uses helm); then, only where the cluster
# tier runs (CLUSTER_TIER from mk/cluster.mk; on a cold machine the tier starts beside the Python suites, Makefile
# TEST_LAYOUT), the binaries of Level A and of Level B's node (hack/tools.sh cluster-a cluster-b); the CPU and Redis
# images (the containers suite, Level B); the Prometheus only the PodMonitor tests use; the GPU image (the containers
# suite only) last.
TEST_IMAGE_GPU = $(if $(filter 0,$(RLP_TEST_GPU_IMAGE)),,"$(IMAGES_SH) build gpu")
TEST_BACKGROUND = "hack/tools.sh all" $(if $(CLUSTER_TIER),"hack/tools.sh cluster-a cluster-b") \
  "$(IMAGES_SH) build cpu redis" $(if $(CLUSTER_TIER),"hack/tools.sh prometheus-k8s") $(TEST_IMAGE_GPU)
TEST_PREREQS += test-background

.PHONY: tools test-background kind-tool kuberay-operator-binary manifests test-chart lint-chart deploy-cluster undeploy

test-background: venv ## Start building what `make test` needs in the background (log: $(RLP_CACHE)/logs/background.log)
	@# The Docker engine first, in the foreground: started by the nice'd build, it (and every container) would stay nice.
	@$(IMAGES_SH) dockerd || echo "[background] no Docker engine: the containers suite says why"
	@hack/background.sh start $(TEST_BACKGROUND)

tools: ## Build helm, kubeconform, helm-unittest + fetch K8s/KubeRay/prometheus-operator schemas (cached by version)
	@hack/tools.sh all

kind-tool: ## Build kind from the Go module proxy (cached by version)
	@hack/tools.sh kind

kuberay-operator-binary: ## Build the KubeRay operator binary of KUBERAY_VERSION (to run it outside a cluster)
	@hack/tools.sh kuberay-operator-binary

manifests: venv tools ## Render k8s/ from the chart; refresh the chart's serve config copy, README and Ray dashboards
	hack/render-manifests.sh

lint-chart: tools ## helm lint --strict the chart with every ci/*-values.yaml
	@eval "$$(hack/tools.sh env | sed 's/^/export /')"; for f in charts/rl-platform/ci/*-values.yaml; do \
	  "$$HELM" lint --strict --kube-version "$$KUBE_VERSION" charts/rl-platform -f "$$f" || exit 1; done

test-chart: venv tools ## Chart tests only: helm lint, helm-unittest, kubeconform, schema rejections, manifest drift
	$(PY) -m pytest -m chart tests/chart $(PYTEST_ARGS)

deploy-cluster: ## Cluster (CLUSTER=auto|local|kind, LEVEL=a|b for local) + KubeRay operator + images + the chart release
	@hack/tools.sh helm  # all it needs of `make tools` (the cluster tier's binaries: hack/cluster.sh up)
	CLUSTER=$(CLUSTER) LEVEL=$(LEVEL) KIND_CLUSTER=$(KIND_CLUSTER) K8S_NAMESPACE=$(K8S_NAMESPACE) MONITORING=$(MONITORING) \
	  hack/deploy-cluster.sh up

undeploy: ## Uninstall the chart release and delete the cluster (kind) or stop it (local: cluster-down)
	CLUSTER=$(CLUSTER) KIND_CLUSTER=$(KIND_CLUSTER) K8S_NAMESPACE=$(K8S_NAMESPACE) hack/deploy-cluster.sh down
