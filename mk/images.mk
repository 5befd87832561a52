# Container images (Dockerfile.cpu, Dockerfile.gpu): built by hack/images.sh with a local Docker engine, no registry.
# Tags come from mk/versions.mk (IMAGE_CPU / IMAGE_GPU) when it defines them; these are the fallbacks.
IMAGE_REPO ?= rl-platform
VERSION ?= 0.1.0
IMAGE_CPU ?= $(IMAGE_REPO):$(VERSION)-cpu
IMAGE_GPU ?= $(IMAGE_REPO):$(VERSION)-gpu
IMAGES_SH ?= hack/images.sh
VENV ?= .venv
PY ?= $(VENV)/bin/python
# Exported so hack/images.sh and tests/containers use the same tags.
export IMAGE_CPU IMAGE_GPU

.PHONY: images images-gpu images-all images-report images-pipcheck kind-load kind-load-gpu dockerd test-containers test-containers-gpu

images: ## Build the CPU image (trainer + serving): starts dockerd, makes the base image, fills the wheelhouse
	$(IMAGES_SH) build cpu

images-gpu: ## Build the GPU image (CUDA torch from PyPI; ~6 GB, reuses the CPU build's cached stages)
	$(IMAGES_SH) build gpu

images-all: ## Build the CPU and GPU images
	$(IMAGES_SH) build cpu gpu

images-report: ## Print image sizes and the largest layers
	$(IMAGES_SH) report cpu gpu

images-pipcheck: ## Prove pip inside an image build trusts the extra CA bundle (RLP_CA_BUNDLE)
	$(IMAGES_SH) pipcheck

kind-load: ## Load the CPU image into a kind cluster (KIND_CLUSTER, default "kind") when one exists
	$(IMAGES_SH) kind-load cpu

kind-load-gpu: ## Load the GPU image into a kind cluster when one exists
	$(IMAGES_SH) kind-load gpu

dockerd: ## Start the Docker engine (dockerd) when none answers
	$(IMAGES_SH) dockerd

test-containers: ## Smoke-test the CPU image: train CartPole, serve it, read-only rootfs, non-root (builds if needed)
	$(PY) -m pytest tests/containers -m docker

test-containers-gpu: ## Also build and check the GPU image (opt-in: RLP_TEST_GPU_IMAGE=1)
	RLP_TEST_GPU_IMAGE=1 $(PY) -m pytest tests/containers -m docker
