# Container images (Dockerfile.cpu, Dockerfile.gpu): built by hack/images.sh with a local Docker engine, no registry.
# See docker/README.md. Tags: IMAGE_CPU / IMAGE_GPU of mk/versions.mk (the only place they are written).
IMAGES_SH ?= hack/images.sh
# The kind cluster `make deploy-cluster` (mk/k8s.mk) creates.
KIND_CLUSTER ?= rl-platform
VENV ?= .venv
PY ?= $(VENV)/bin/python
# Exported so hack/images.sh and tests/containers use the same tags.
export IMAGE_CPU IMAGE_GPU

.PHONY: images images-cpu images-gpu images-report images-pipcheck kind-load dockerd test-containers

images: ## Build both images (CPU ~6 min cold, GPU +1.5 min from its cache): dockerd, base image, wheelhouse
	$(IMAGES_SH) build cpu gpu

images-cpu: ## Build the CPU image only (trainer + serving, 4.7 GB)
	$(IMAGES_SH) build cpu

images-gpu: ## Build the GPU image only (CUDA torch from PyPI, 6.2 GB)
	$(IMAGES_SH) build gpu

images-report: ## Print image sizes and the largest layers
	$(IMAGES_SH) report cpu gpu

images-pipcheck: ## Prove pip inside an image build trusts the extra CA bundle (RLP_CA_BUNDLE)
	$(IMAGES_SH) pipcheck

kind-load: ## Load the images into the kind cluster KIND_CLUSTER when one exists (CPU; GPU too if built)
	KIND_CLUSTER=$(KIND_CLUSTER) $(IMAGES_SH) kind-load

dockerd: ## Start the Docker engine (dockerd) when none answers
	$(IMAGES_SH) dockerd

test-containers: ## Container smoke tests: build, train CartPole, serve it, read-only + non-root (RLP_TEST_GPU_IMAGE=0 skips GPU)
	$(PY) -m pytest tests/containers -m docker
