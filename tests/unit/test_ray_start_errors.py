"""Ray's own start-up failure on an overloaded machine (its raylet does not register within Ray's fixed 30 s; Ray
raises a bare Exception): every entry point that starts a local Ray (trainer, policy server, rl-eval) stops the
half-started Ray and tries once more (embedded_ray.init_local), and a second failure reaches the user as one error
naming it (embedded_ray.start_failure), not a traceback; any other unexpected exception still propagates, untried
again. Ray's failure is injected: an overloaded host cannot be made on demand."""

import os
import subprocess
import sys
import textwrap

import pytest
import ray

import embedded_ray
from rl_eval.cli import start_ray
from rl_eval.episodes import EvalError
from serving import launch
from trainer.config import ResourcesConf
from trainer.errors import TrainerError
from trainer.resources import init_ray

# Ray 2.58's message (ray/_private/node.py), verbatim.
RAY_MESSAGE = ("The current node timed out during startup. This could happen because some of the raylet failed to "
               "startup or the GCS has become overloaded.")


@pytest.fixture
def ray_init_raises(monkeypatch):
    """ray.init replaced by one that raises the given message; the process environment restored afterwards (the
    server's start sets ingress and Ray variables before it calls ray.init)."""
    saved = dict(os.environ)
    monkeypatch.setattr(embedded_ray, "configure", lambda *a, **k: "")
    calls = {"init": 0, "stop": 0}
    # Nothing was started: the clean-up between tries is counted, not run (its own test below runs it for real).
    monkeypatch.setattr(embedded_ray, "stop_started_ray", lambda: calls.__setitem__("stop", calls["stop"] + 1))

    def arm(message: str) -> dict:
        def init(**_):
            calls["init"] += 1
            raise Exception(message)

        monkeypatch.setattr(ray, "init", init)
        monkeypatch.setattr(ray, "is_initialized", lambda: False)
        return calls

    yield arm
    os.environ.clear()
    os.environ.update(saved)


def start_server() -> None:
    launch.start(launch.load_config(), host="127.0.0.1", port=1, ready_timeout_s=1)


ENTRY_POINTS = {
    "trainer": (lambda: init_ray(ResourcesConf()), TrainerError),
    "server": (start_server, launch.LaunchError),
    "rl-eval": (lambda: start_ray(None, None), EvalError),
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_raylet_that_does_not_register_in_time_is_one_clear_error(ray_init_raises, entry):
    call, error = ENTRY_POINTS[entry]
    calls = ray_init_raises(RAY_MESSAGE)
    with pytest.raises(error) as e:
        call()
    msg = str(e.value)
    assert msg.startswith(embedded_ray.DID_NOT_START) and "30 s" in msg and "overloaded" in msg and "\n" not in msg
    assert calls == {"init": 2, "stop": 1}, "one more try, after stopping what the first one started"


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_another_unexpected_exception_is_not_relabelled(ray_init_raises, entry):
    call, error = ENTRY_POINTS[entry]
    calls = ray_init_raises("something else")
    with pytest.raises(Exception, match="something else") as e:
        call()
    assert not isinstance(e.value, error)
    assert calls == {"init": 1, "stop": 0}


def test_the_second_try_starts_after_the_first_tries_ray_is_stopped():
    """In a process of its own (the clean-up kills this process's Ray children): the first ray.init leaves a child
    named like a Ray worker (`ray::...`) and one unrelated child, then times out; the second finds the Ray child
    gone and the other alive, and its result is what init_local returns."""
    script = textwrap.dedent(f"""
        import subprocess, sys, ray, embedded_ray
        kids = {{}}

        def init(**kw):
            if not kids:
                quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                kids["ray"] = subprocess.Popen(["bash", "-c", "exec -a ray::IDLE sleep 300"], **quiet)
                kids["other"] = subprocess.Popen(["sleep", "300"], **quiet)
                raise Exception({RAY_MESSAGE!r})
            return ("started", kids["ray"].poll() is not None, kids["other"].poll() is None, kw)

        ray.init = init
        print(embedded_ray.init_local(num_cpus=1))
        for p in kids.values():
            p.kill()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "('started', True, True, {'num_cpus': 1})", proc.stdout + proc.stderr
    assert embedded_ray.DID_NOT_START in proc.stderr and "once more" in proc.stderr


def test_a_failed_connection_to_an_existing_ray_says_why_not_only_where(ray_init_raises, monkeypatch):
    """Ray's "Failed to connect to Ray cluster at HOST:PORT" names only where: its cause (a GCS that did not answer,
    no node matching this host) is on the same line; an existing cluster is never started, so never tried twice."""
    calls = ray_init_raises("unused")
    monkeypatch.setattr("trainer.resources.check_reachable", lambda address: None)

    def init(**_):
        calls["init"] += 1
        try:
            raise RuntimeError("No node info found matching attributes: '192.0.2.2'\nmore detail")
        except RuntimeError as e:
            raise ConnectionError("Failed to connect to Ray cluster at 192.0.2.2:6379") from e

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(TrainerError) as e:
        init_ray(ResourcesConf(address="127.0.0.1:6379"))
    assert str(e.value) == ("cannot connect to Ray at '127.0.0.1:6379': Failed to connect to Ray cluster at "
                            "192.0.2.2:6379: No node info found matching attributes: '192.0.2.2'")
    assert calls == {"init": 1, "stop": 0}
