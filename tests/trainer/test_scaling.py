"""Data-parallel learners and mixed precision on the real RLlib, CPU only (DDP over gloo, bf16 autocast).

GPU variants (NCCL, fp16) are the same code paths with resources.num_gpus_per_learner > 0; they run wherever a GPU
is present (bench/ddp_bench.py), never in CI.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rl_checkpoint.checkpoint import POLICY_ID
from hydra import compose, initialize_config_dir

from trainer_helpers import REPO, run_trainer, short_tmp, summary_of

pytestmark = pytest.mark.slow

# Three times a random CartPole policy's ~22: reached in a few thousand steps by a learning PPO, never by chance.
LEARNED_RETURN = 66.0


def compose_cfg(*overrides: str):
    from trainer.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "hydra_conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def learner_states(algo) -> list[tuple[int, dict[str, np.ndarray]]]:
    """(pid, RLModule weights) of every learner actor, read inside the actors themselves."""
    results = algo.learner_group.foreach_learner(
        lambda learner: (
            __import__("os").getpid(),
            {k: v.detach().cpu().numpy().copy() for k, v in learner.module[POLICY_ID].state_dict().items()},
        )
    )
    out = []
    for r in results:
        assert r.ok, r.get()
        out.append(r.get())
    return out


def test_two_ddp_learners_learn_and_keep_identical_weights():
    from trainer.algo import build_algo_config
    from trainer.callbacks import RETURN_MEAN_KEY, WINDOW
    from trainer.resources import init_ray, set_torch_threads
    from trainer.validate import validate

    import ray

    cfg = compose_cfg("resources.num_learners=2", "resources.num_cpus=2", f"resources.ray_tmp_dir={short_tmp()}",
                      "seed=7")
    validate(cfg)
    set_torch_threads(cfg.resources.torch_threads)
    init_ray(cfg.resources)
    try:
        algo = build_algo_config(cfg).build_algo()
        try:
            before = learner_states(algo)
            assert len(before) == 2 and before[0][0] != before[1][0], "expected two learner processes"
            ret, window = -math.inf, 0
            for _ in range(30):
                result = algo.train()
                ret, window = result[RETURN_MEAN_KEY], result["episode_return_window"]
                if window >= WINDOW and ret >= LEARNED_RETURN:
                    break
            after = learner_states(algo)
        finally:
            algo.stop()
    finally:
        ray.shutdown()

    assert window >= WINDOW and ret >= LEARNED_RETURN, f"return {ret} over {window} episodes after 30 iterations"
    (_, w0), (_, w1) = after
    assert w0.keys() == w1.keys() and w0
    for k in w0:
        np.testing.assert_array_equal(w0[k], w1[k], err_msg=f"learners disagree on {k}")
    assert any(not np.array_equal(before[0][1][k], w0[k]) for k in w0), "no update reached the weights"


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    """One tiny bf16 CartPole run through the real entry point, traced with debug.timeline."""
    out = tmp_path_factory.mktemp("bf16")
    proc = run_trainer(
        # One learner actor: the bf16 learner class travels to a remote process, and the trace has actor spans.
        f"output_dir={out}", "algo.precision=bf16", "resources.num_learners=1", f"stop.episode_return_mean={LEARNED_RETURN}",
        "stop.env_steps=30000", f"debug.timeline={out}/trace/timeline.json", timeout=600,
    )
    return out, summary_of(proc), proc


def test_bf16_trains_cartpole(bf16_run):
    out, summary, _ = bf16_run
    assert summary["stop_reason"].startswith("episode_return_mean"), summary
    assert summary["episode_return_mean"] >= LEARNED_RETURN
    assert "precision: bf16" in (out / "config.yaml").read_text()


def test_bf16_checkpoint_serves_in_fp32(bf16_run):
    import torch
    from serving.policy import LoadedPolicy

    out, summary, _ = bf16_run
    policy = LoadedPolicy.load("cartpole", summary["checkpoint"])
    assert {p.dtype for p in policy.module.parameters()} == {torch.float32}
    rng = np.random.default_rng(0)
    raw = rng.uniform(-0.2, 0.2, size=(64, 4)).astype(np.float32)
    obs = policy.observations(raw.tolist())
    logits = policy.inference.logits(obs)
    assert logits.dtype == np.float32 and logits.shape == (64, 2) and np.isfinite(logits).all()
    # The served actions are the loaded module's own greedy fp32 forward pass (no autocast at serving time).
    with torch.no_grad():
        expected = policy.module.forward_inference({"obs": torch.from_numpy(raw)})["action_dist_inputs"].argmax(-1).tolist()
    assert policy.act(obs) == expected
    assert len(set(expected)) == 2, "a trained CartPole policy pushes both ways"


def test_debug_timeline_writes_a_chrome_trace(bf16_run):
    out, _, proc = bf16_run
    trace = out / "trace" / "timeline.json"
    assert f"timeline: {trace}" in proc.stdout
    events = json.loads(trace.read_text())
    # Chrome trace event format: complete events ("X") with a name, a start and a duration, per worker/thread.
    spans = [e for e in events if e.get("ph") == "X"]
    assert spans and all({"name", "ts", "dur", "pid", "tid"} <= e.keys() for e in spans)
    # Every learner update is an actor call (RLlib dispatches them as `apply` on the learner actor): traced.
    names = {e["name"] for e in spans}
    assert {"task:execute", "apply"} <= names, sorted(names)
