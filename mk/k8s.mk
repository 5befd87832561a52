# Kubernetes half of rl-platform: tools, chart tests, rendered manifests, kind deployment.
# Versions live in mk/versions.mk only.
ifndef KUBERAY_VERSION
include $(dir $(lastword $(MAKEFILE_LIST)))versions.mk
endif

RLP_CACHE ?= $(HOME)/.cache/rl-platform
export RLP_CACHE
# Cluster/namespace for `make deploy-cluster`; MONITORING=1 also installs kube-prometheus-stack.
KIND_CLUSTER ?= rl-platform
K8S_NAMESPACE ?= rl-platform
MONITORING ?= 0

# The chart tests need the tools built first (a no-op when they are cached).
TEST_PREREQS += tools

.PHONY: tools kind-tool kuberay-operator-binary manifests test-chart lint-chart deploy-cluster undeploy

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

deploy-cluster: tools kind-tool ## kind cluster + KubeRay operator (+ kube-prometheus-stack if MONITORING=1) + images + chart
	KIND_CLUSTER=$(KIND_CLUSTER) K8S_NAMESPACE=$(K8S_NAMESPACE) MONITORING=$(MONITORING) hack/deploy-cluster.sh up

undeploy: ## Uninstall the chart and the operator releases and delete the kind cluster
	KIND_CLUSTER=$(KIND_CLUSTER) K8S_NAMESPACE=$(K8S_NAMESPACE) hack/deploy-cluster.sh down
