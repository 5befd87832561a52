"""Fixtures of the chart tests; the helpers live in chartkit.py."""

import pytest

from chartkit import Tools, tool_env


@pytest.fixture(scope="session")
def tools() -> Tools:
    return Tools(tool_env())
