"""Fixtures of the container-image tests: defined in containerkit.py (one module, importable by the tests)."""

import pytest
from containerkit import (  # noqa: F401  (fixtures)
    cpu_image,
    docker_engine,
    gpu_image,
    serve_container,
    trainer_run,
)
from trainer_helpers import docker_containers_lock


@pytest.fixture(autouse=True, scope="module")
def _containers_beside_the_cluster_tier():
    # The cluster tier photographs the host before and after its clusters (tests/k8s/hostsnap.py): not while this
    # suite's containers come and go in the other worker (Makefile TEST_LAYOUT=cold).
    with docker_containers_lock(exclusive=False):
        yield
