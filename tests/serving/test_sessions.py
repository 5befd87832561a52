"""Frame-stacking sessions: bounded by count (least recently used go first) and idle time, kept across a reload."""

from __future__ import annotations

import types

import numpy as np
import pytest
import requests

import serving.sessions
from serving.sessions import FrameStacks

pytestmark = pytest.mark.serve

FRAME = (2, 2, 1)


def _frame(v: float) -> np.ndarray:
    return np.full(FRAME, v, np.float32)


@pytest.fixture
def clock(monkeypatch):
    """A hand-moved monotonic clock for serving.sessions only."""
    now = [1000.0]
    monkeypatch.setattr(serving.sessions, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    return now


def test_least_recently_used_session_is_evicted_first(clock):
    st = FrameStacks(num_frames=2, frame_shape=FRAME, max_sessions=2, ttl_s=600)
    st.push("a", _frame(1), reset=True)
    st.push("b", _frame(2), reset=True)
    clock[0] += 1
    st.push("a", _frame(3), reset=False)  # "a" is now the most recent
    st.push("c", _frame(4), reset=True)  # over the limit: "b" goes, not "a"
    assert len(st) == 2
    obs, new, count = st.push("a", _frame(5), reset=False)
    assert (new, count) == (False, 3) and obs[..., 0].max() == 3 and obs[..., 1].max() == 5
    _, new, count = st.push("b", _frame(6), reset=False)
    assert (new, count) == (True, 1), "the evicted session must start over (zero-filled)"


def test_idle_sessions_expire_after_ttl(clock):
    st = FrameStacks(num_frames=2, frame_shape=FRAME, max_sessions=10, ttl_s=60)
    st.push("old", _frame(1), reset=True)
    clock[0] += 30
    st.push("young", _frame(1), reset=True)
    clock[0] += 31  # "old" idle 61 s, "young" 31 s
    st.push("other", _frame(1), reset=True)
    assert len(st) == 2
    obs, new, count = st.push("old", _frame(2), reset=False)
    assert (new, count) == (True, 1) and obs[..., 0].max() == 0.0  # zero-filled again
    _, new, count = st.push("young", _frame(2), reset=False)
    assert (new, count) == (False, 2)


def test_session_survives_a_reload(server):
    """A reload that loads the Pong policy anew (changed session limits reload every policy) keeps the stacks."""
    url = server.base + "/v1/policies/pong/act"
    frame = np.zeros((64, 64, 1), np.float32).tolist()
    for t in range(2):
        r = requests.post(url, json={"session_id": "across-reload", "frame": frame, **({"reset": True} if t == 0 else {})},
                          timeout=30)
        assert r.status_code == 200, r.text
    loaded_at = requests.get(server.base + "/v1/policies/pong", timeout=10).json()["loaded_at"]
    server.user_config["max_sessions"] = 512
    try:
        server.reload(server.policies)
        assert requests.get(server.base + "/v1/policies/pong", timeout=10).json()["loaded_at"] != loaded_at
        r = requests.post(url, json={"session_id": "across-reload", "frame": frame}, timeout=30)
        assert r.status_code == 200 and r.json()["session"] == {"id": "across-reload", "new": False, "frames": 3}, r.text
    finally:
        server.user_config.pop("max_sessions")
        server.reload(server.policies)
