import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True, scope="session")
def _no_stray_ray_address():
    # Tests start their own Ray (embedded or ray.cluster_utils.Cluster); never a cluster found via RAY_ADDRESS.
    os.environ.pop("RAY_ADDRESS", None)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    yield
