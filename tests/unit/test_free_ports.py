"""tests/trainer_helpers.free_ports under pytest-xdist: each worker hands out ports from its own blocks only, so two
workers (each with its own record of what it handed out) never pick the same port - CI saw a policy server's port
answered by another worker's Ray metrics port."""

from __future__ import annotations

import pytest

import trainer_helpers as th


def _blocks(monkeypatch, worker: str, count: str, n: int) -> set[int]:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", count)
    monkeypatch.setattr(th, "_HANDED_OUT", set())  # a fresh worker process
    lo, _ = th._private_port_range()
    return {(p - lo) // th.PORT_BLOCK for p in th.free_ports(n)}


def test_two_workers_hand_out_disjoint_blocks(monkeypatch):
    first = _blocks(monkeypatch, "gw0", "2", 20)
    second = _blocks(monkeypatch, "gw1", "2", 20)
    assert all(b % 2 == 0 for b in first) and all(b % 2 == 1 for b in second), (sorted(first), sorted(second))


@pytest.mark.parametrize("worker, count", [("", ""), ("master", "2"), ("gw0", "0"), ("gwx", "2")])
def test_outside_xdist_every_block_is_available(monkeypatch, worker, count):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", count)
    assert th._xdist_worker() == (0, 1)
