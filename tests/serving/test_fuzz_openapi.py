"""Property-based bad input: schemathesis generates requests from the server's own OpenAPI document.

Every operation of GET /openapi.json gets requests that fit the schema (positive) and requests that break it
(negative: wrong types, missing/extra fields, odd path parameters), with the policy name left to the generator
and pinned to a served policy (CartPole, frame-stacked Pong) so bodies reach validation and inference. Whatever
comes in, the answer is never a 5xx, and the server is still healthy and ready afterwards. Bounded: a fixed
number of examples per operation, derandomized so a failure reproduces, no per-example deadline.
"""

from __future__ import annotations

import time

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation.modes import GenerationMode

pytestmark = pytest.mark.serve

EXAMPLES = 50  # per operation, per mode, per pinned name: ~800 requests in all (the rest are unsatisfiable)


def test_generated_requests_never_get_a_5xx(server):
    schema = schemathesis.openapi.from_url(server.base + "/openapi.json", timeout=10)
    session = requests.Session()
    seen: dict[int, int] = {}
    five_xx: list[str] = []
    unbreakable: list[str] = []
    t0 = time.monotonic()

    def run(op, mode, path_parameters=None):
        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy(mode, path_parameters=path_parameters))
        def check(case):
            r = case.call(base_url=server.base, session=session, timeout=30)
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            if r.status_code >= 500:
                five_xx.append(f"{case.method} {case.formatted_path} -> {r.status_code}: {r.text[:200]}")

        try:
            check()
        except Unsatisfiable:
            # Negative mode on an operation with nothing to break (no parameters, no body): no such request.
            assert mode is GenerationMode.NEGATIVE, f"no valid request for {op.label}"
            unbreakable.append(op.label)

    n_ops = 0
    for result in schema.get_all_operations():
        op = result.ok()
        n_ops += 1
        pins = [None]
        if "{name}" in op.path and "sessions" not in op.path:
            pins += [{"name": "default"}, {"name": "pong"}]
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for pin in pins:
                run(op, mode, pin)
    print(f"\nschemathesis: {n_ops} operations, {sum(seen.values())} requests in {time.monotonic() - t0:.1f}s, "
          f"status counts {dict(sorted(seen.items()))}; no invalid request possible for {unbreakable}")
    assert n_ops >= 7, "the OpenAPI document lost operations"
    assert seen.get(200) and seen.get(422), f"generated input never reached inference or validation: {seen}"
    assert not five_xx, "5xx on generated input:\n" + "\n".join(five_xx[:20])
    assert requests.get(server.base + "/healthz", timeout=10).status_code == 200
    assert requests.get(server.base + "/readyz", timeout=10).status_code == 200
