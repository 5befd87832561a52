import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def built_helm() -> str:
    """The pinned helm, once hack/tools.sh has built it (`make test` builds it in the background: this waits)."""
    from rl_submit.cli import Problem, find_helm

    build = subprocess.run([str(ROOT / "hack" / "tools.sh"), "helm"], capture_output=True, text=True)
    try:
        return find_helm(None)
    except Problem:
        msg = f"helm not built (`make tools`): hack/tools.sh helm exited {build.returncode}: {build.stderr[-1500:]}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg)
        pytest.skip(msg)
