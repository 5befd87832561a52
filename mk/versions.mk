# Single source of versions for the Kubernetes half of rl-platform.
# Plain `NAME := value` lines only: hack/tools.sh, hack/images.sh and tests/chart read this file too.
# Derived from here: image tags and their version label (hack/images.sh, mk/images.mk, the Dockerfiles' build arg).
# Copies that cannot read this file (pyproject.toml version and ray pin, Chart.yaml appVersion and annotations,
# values.yaml image tags and ray.version, docs) are checked by tests/chart/test_chart_versions.py.

# KubeRay: the release this project runs and tests: the operator the local cluster tier builds and runs, the ray.io
# CRDs the chart is validated against (ray-operator Go module), the upstream kuberay-operator chart `make
# deploy-cluster` installs on kind, and the version Chart.yaml and the chart README declare (tests/chart keeps those
# copies equal; tests/k8s/test_0_cluster.py asserts the running operator reports it).
KUBERAY_VERSION := 1.6.2
# The release the chart is meant to move to. Not used: the Go module proxy reachable from this project's machines
# answers 403 "not available" for every github.com/ray-project/kuberay/*@v1.7.0 zip (v1.4.0..v1.6.2 download), so
# nothing of 1.7.0 can be built or tested here. Once it downloads: set KUBERAY_VERSION to it, run `make manifests`
# and the cluster tier, and delete this line. The chart renders no field only 1.7 understands (kubeconform -strict
# against 1.6.2's CRDs would reject one).
KUBERAY_TARGET_VERSION := 1.7.0
RAY_VERSION := 2.58.0

# Tools built from the Go module proxy into $(RLP_CACHE)/tools/<tool>-<version>/
HELM_VERSION := 3.22.0
KUBECONFORM_VERSION := 0.8.0
HELM_UNITTEST_VERSION := 1.1.2
KIND_VERSION := 0.33.0
PROMETHEUS_OPERATOR_VERSION := 0.89.0
# k8s.io/pod-security-admission: the upstream "restricted" Pod Security Standard checks (hack/pod-security-check).
POD_SECURITY_ADMISSION_VERSION := 0.37.0
# kubernetes-validate (PyPI) ships the offline Kubernetes JSON schemas used by kubeconform.
KUBERNETES_VALIDATE_VERSION := 1.34.1

# Kubernetes version the chart is rendered and validated for (helm --kube-version, kubeconform -kubernetes-version).
KUBE_VERSION := 1.34.0

# Optional monitoring stack installed by `make deploy-cluster MONITORING=1` (users' machines only).
KUBE_PROMETHEUS_STACK_VERSION := 79.0.0

# Images built by the Dockerfiles in this repo.
IMAGE_CPU := rl-platform:0.1.0-cpu
IMAGE_GPU := rl-platform:0.1.0-gpu
# Redis for Ray's GCS fault tolerance (docker/redis.Dockerfile: Debian bookworm's redis-server 7.0.x, BSD-3-Clause).
IMAGE_REDIS := rl-platform:0.1.0-redis

# The local cluster tier (hack/cluster.sh, `make cluster-up`): every component built from the Go module proxy
# into $(RLP_CACHE)/tools/<component>-<version>/. One Kubernetes 1.34.x release for all its binaries: 1.35+ refuses
# cgroup v1 by default (this project's CI machines are cgroup v1).
KUBERNETES_VERSION := 1.34.4
ETCD_VERSION := 3.6.16
KWOK_VERSION := 0.8.0
COREDNS_VERSION := 1.14.7
# The upstream Prometheus server (github.com/prometheus/prometheus module v0.<major*100+minor>.<patch>), built with
# only its kubernetes_sd discovery: the cluster tier scrapes the chart's PodMonitors through it. Debian's
# prometheus package (the live test, `make monitor`) is built without kubernetes_sd.
PROMETHEUS_K8S_VERSION := 3.16.0
# Kueue (sigs.k8s.io/kueue, Apache-2.0): queues, quotas and priorities for RayJobs (suspend until admitted), run
# out of cluster by hack/cluster.sh; its CRDs also validate the chart's queue objects (tests/chart).
KUEUE_VERSION := 0.17.0

# Dashboard type check (tests/chart/test_chart_dashboard_schema.py): Grafana's published schema types (npm
# @grafana/schema, Apache-2.0) checked by the TypeScript compiler, cached in $(RLP_CACHE)/grafana-schema-<v>-ts-<v>/.
GRAFANA_SCHEMA_VERSION := 13.2.3
TYPESCRIPT_VERSION := 5.9.3
