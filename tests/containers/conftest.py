"""Fixtures of the container-image tests: defined in containerkit.py (one module, importable by the tests)."""

from containerkit import (  # noqa: F401  (fixtures)
    cpu_image,
    docker_engine,
    gpu_image,
    serve_container,
    trainer_run,
)
