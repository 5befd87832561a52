"""trainer.diagnose's verdicts on Ray state records (the real records are read in tests/trainer/test_troubleshooting.py)."""

import subprocess
import sys

from trainer.diagnose import report

ROLLOUT = {"node_id": "r", "node_ip": "10.0.0.1", "resources_total": {"CPU": 2.0, "rollout_pool": 2.0}}
LEARNER = {"node_id": "l", "node_ip": "10.0.0.2", "resources_total": {"CPU": 4.0, "GPU": 1.0, "learner_pool": 1.0}}
ENV_RUNNER = {"class_name": "SingleAgentEnvRunner", "state": "ALIVE", "pid": 11,
              "required_resources": {"CPU": 1.0, "rollout_pool": 1.0}}
LEARNER_ACTOR = {"class_name": "create_executable_class.<locals>._WrappedExecutable", "state": "ALIVE", "pid": 12,
                 "required_resources": {"CPU": 1.0, "GPU": 1.0, "learner_pool": 1.0}}


def test_actors_in_their_pools_are_ok():
    lines, bad = report([dict(ENV_RUNNER, node_id="r"), dict(LEARNER_ACTOR, node_id="l")], [ROLLOUT, LEARNER], False)
    assert bad == 0 and [ln.split()[0] for ln in lines] == ["env_runner", "learner"]
    assert "[learner_pool,GPU]" in lines[1]


def test_learner_on_a_rollout_node_is_wrong():
    unpinned = dict(LEARNER_ACTOR, node_id="r", required_resources={"CPU": 1.0})
    lines, bad = report([unpinned], [ROLLOUT, LEARNER], False)
    assert bad == 1 and "WRONG POOL" in lines[0] and "outside the learner pool" in lines[0]


def test_dead_actors_only_with_all():
    dead = dict(ENV_RUNNER, node_id="r", state="DEAD")
    assert report([dead], [ROLLOUT], False)[0] == []
    assert len(report([dead], [ROLLOUT], True)[0]) == 1


def test_unreachable_ray_is_one_line_exit_2():
    proc = subprocess.run([sys.executable, "-m", "trainer.diagnose", "--address", "127.0.0.1:9"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "cannot reach Ray at '127.0.0.1:9'" in proc.stderr
    assert "Traceback" not in proc.stderr
