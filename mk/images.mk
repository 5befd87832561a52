# Container images (Dockerfile.cpu, Dockerfile.gpu): built by hack/images.sh with a local Docker engine, no registry.
# See docker/README.md. Tags: IMAGE_CPU / IMAGE_GPU / IMAGE_REDIS of mk/versions.mk (the only place they are written).
IMAGES_SH ?= hack/images.sh
# The kind cluster `make deploy-cluster` (mk/k8s.mk) creates.
KIND_CLUSTER ?= rl-platform
VENV ?= .venv
PY ?= $(VENV)/bin/python
# Exported so hack/images.sh and tests/containers use the same tags.
export IMAGE_CPU IMAGE_GPU IMAGE_REDIS

.PHONY: images images-cpu images-gpu images-redis images-report images-pipcheck kind-load dockerd test-containers

images: ## Build the images (CPU ~6 min cold, GPU +1.5 min from its cache, Redis <1 min): dockerd, base image, wheelhouse
	$(IMAGES_SH) build cpu gpu redis

images-cpu: ## Build the CPU image only (trainer + serving, 4.7 GB)
	$(IMAGES_SH) build cpu

images-gpu: ## Build the GPU image only (CUDA torch from PyPI, 6.2 GB)
	$(IMAGES_SH) build gpu

images-redis: ## Build the Redis image only (Debian's redis-server 7.0, for Ray GCS fault tolerance; ~40 MB over the base)
	$(IMAGES_SH) build redis

images-report: ## Print image sizes and the largest layers
	$(IMAGES_SH) report cpu gpu redis

images-pipcheck: ## Prove pip inside an image build trusts the extra CA bundle (RLP_CA_BUNDLE)
	$(IMAGES_SH) pipcheck

kind-load: ## Load the images into the kind cluster KIND_CLUSTER when one exists (CPU; GPU too if built)
	KIND_CLUSTER=$(KIND_CLUSTER) $(IMAGES_SH) kind-load

dockerd: ## Start the Docker engine (dockerd) when none answers
	$(IMAGES_SH) dockerd

test-containers: ## Container smoke tests: build, train CartPole, serve it, read-only + non-root (RLP_TEST_GPU_IMAGE=0 skips GPU)
	$(PY) -m pytest tests/containers -m docker
