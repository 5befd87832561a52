"""trainer.startup: the phase clock and the import thread that overlaps ray.init (no timing asserted)."""

import pytest

from trainer.errors import TrainerError
from trainer.startup import Startup


def test_phases_accumulate_and_add_up_to_the_time_before_the_first_sample():
    s = Startup()
    s.mark("imports")
    s.mark("ray.init")
    s.mark("imports")  # the wait for the import thread after ray.init counts as imports
    s.mark("build")
    s.first_result({"timers": {"env_runner_sampling_timer": 0.25}})
    assert s.phases["before_first_sample"] == pytest.approx(s.phases["imports"] + s.phases["ray.init"] + s.phases["build"])
    assert s.phases["first-sample"] == 0.25
    line = s.line()
    assert line.startswith("startup: imports ") and " ray.init " in line and " build " in line
    assert "first-sample 0.2s" in line and "before the first sample" in line
    assert set(s.summary()) == {"imports", "ray_init", "build", "first_sample", "before_first_sample"}


def test_a_result_without_sampling_timer_leaves_first_sample_out():
    s = Startup()
    s.mark("build")
    s.first_result({"timers": {}})
    assert "first-sample" not in s.phases and "first-sample" not in s.line()


def test_an_import_failure_in_the_prewarm_thread_surfaces_in_the_main_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    s = Startup()
    s.prewarm("no_such_algo", torch_threads=1)
    with pytest.raises(TrainerError, match="unknown algo 'no_such_algo'"):
        s.wait_imports()
