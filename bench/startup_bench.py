"""Benchmark: process start -> first CartPole training iteration, per phase, and what each start-up change bought.

Two sets, each interleaved round by round:
- trainer: `python -m trainer stop.iterations=1` of this tree vs the tree before the start-up work (`--baseline-rev`,
  exported with `git archive`, same venv); time from spawning the process to its first `iter` line, plus the
  phases the trainer prints (`startup: imports .. ray.init .. build .. first-sample ..`).
  A third variant connects the trainer to a Ray that is already running (resources.address), as on a cluster.
- probe: the same sequence (imports, ray.init, PPO build, one iteration) in a bare script, one change toggled at a
  time: imports serial vs overlapping ray.init (trainer.startup), Ray's prestarted first-driver workers on vs off.
  Its ray.init and import phases alone are the floors: RLlib's all-local path (num_env_runners=0, num_learners=0)
  still needs a running Ray (EnvRunnerGroup.__init__ calls ray.put; metrics go through ray.util.metrics).

Writes bench/results/startup_bench.json and .png.

    .venv/bin/python bench/startup_bench.py [--rounds 3] [--baseline-rev 94fb3e3] [--skip-trainer] [--skip-probe]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchkit  # noqa: E402

REPO = benchkit.REPO
# main just before the start-up work (trainer.startup): the "before" of the before/after.
BASELINE_REV = "94fb3e3"
PHASE_RE = re.compile(r"startup: (.*?)(?: \(|$)")


def trainer_run(src: Path, overrides: tuple[str, ...] = ()) -> dict:
    out_dir = tempfile.mkdtemp(prefix="bench-start-")
    env = dict(os.environ, PYTHONPATH=str(src))
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "trainer", f"output_dir={out_dir}", "stop.iterations=1",
           f"resources.ray_tmp_dir={tempfile.mkdtemp(prefix='rb', dir='/tmp')}", *overrides]
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=src, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first_iter = None
    phases: dict[str, float] = {}
    for line in proc.stdout:  # type: ignore[union-attr]
        if first_iter is None and re.search(r"\] iter +1 \|", line):
            first_iter = time.time() - t0
        m = PHASE_RE.search(line)
        if m:
            phases = {k: float(v.rstrip("s")) for k, v in re.findall(r"(\S+) ([\d.]+s)", m.group(1))}
    proc.wait(timeout=600)
    if proc.returncode != 0 or first_iter is None:
        raise RuntimeError(f"{cmd} in {src} failed (exit {proc.returncode})")
    return {"first_iteration_s": round(first_iter, 2), "process_wall_s": round(time.time() - t0, 2), **phases}


def ray_head() -> tuple[subprocess.Popen, str]:
    """A Ray that is already running (as on a cluster, or `ray start` beforehand): its GCS address."""
    code = ("import ray, sys, time, tempfile; ray.init(include_dashboard=False, logging_level='ERROR', "
            "_temp_dir=tempfile.mkdtemp(prefix='rb', dir='/tmp')); print(ray.get_runtime_context().gcs_address, "
            "flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()  # type: ignore[union-attr]


def probe_run(overlap: bool, prestart: bool) -> dict:
    args = [sys.executable, __file__, "--probe", f"overlap={int(overlap)}", f"prestart={int(prestart)}"]
    return benchkit.timed_json_run(args, timeout=600)


def probe(overlap: bool, prestart: bool) -> None:
    """Child process: imports, ray.init, build, one iteration of the default CartPole experiment."""
    import psutil

    t_start = psutil.Process().create_time()
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    sys.path.insert(0, str(REPO))
    import threading

    import ray

    def heavy_imports() -> None:
        import torch._dynamo  # noqa: F401 - torch.optim's first optimizer imports it otherwise
        from ray.rllib.algorithms.ppo import PPOConfig  # noqa: F401

    kwargs = {"include_dashboard": False, "num_gpus": 0, "logging_level": "WARNING",
              "_temp_dir": tempfile.mkdtemp(prefix="rb", dir="/tmp"),
              "_system_config": {"enable_worker_prestart": False, "prestart_worker_first_driver": prestart}}
    ph: dict[str, float] = {}
    t = time.time()
    ph["python"] = t - t_start
    if overlap:
        th = threading.Thread(target=heavy_imports)
        th.start()
        ray.init(**kwargs)
        t1 = time.time()
        th.join()
        t2 = time.time()
        ph["ray.init"], ph["imports"] = t1 - t, t2 - t1
    else:
        heavy_imports()
        t1 = time.time()
        ray.init(**kwargs)
        t2 = time.time()
        ph["imports"], ph["ray.init"] = t1 - t, t2 - t1
    import torch
    from hydra import compose, initialize_config_dir

    from trainer.algo import build_algo_config
    from trainer.config import register_configs

    torch.set_num_threads(1)
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "hydra_conf"), version_base="1.3"):
        cfg = compose("config")
    t = time.time()
    algo = build_algo_config(cfg).build_algo()
    ph["build"] = time.time() - t
    ph["before_first_sample"] = time.time() - t_start
    t = time.time()
    algo.train()
    ph["first_iteration"] = time.time() - t
    print(json.dumps({k: round(v, 3) for k, v in ph.items()}), flush=True)
    algo.stop()
    ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline-rev", default=BASELINE_REV)
    ap.add_argument("--skip-trainer", action="store_true")
    ap.add_argument("--skip-probe", action="store_true")
    ap.add_argument("--probe", nargs=2)
    args = ap.parse_args()
    if args.probe:
        opts = dict(a.split("=") for a in args.probe)
        probe(overlap=opts["overlap"] == "1", prestart=opts["prestart"] == "1")
        return
    load = os.getloadavg()
    report: dict = {"goal_s_before_first_sample": 5.0}
    if not args.skip_trainer:
        base = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
        subprocess.run(f"git -C {REPO} archive {args.baseline_rev} | tar -x -C {base}", shell=True, check=True)
        def attached() -> dict:
            # The head runs only during this variant (an idle Ray still costs the others CPU), started untimed.
            head, address = ray_head()
            try:
                return trainer_run(REPO, (f"resources.address={address}",))
            finally:
                head.stdin.close()  # type: ignore[union-attr]
                head.wait(timeout=120)

        runs = benchkit.interleave(
            {f"trainer@{args.baseline_rev}": lambda: trainer_run(base), "trainer": lambda: trainer_run(REPO),
             "trainer, Ray already running": attached},
            args.rounds, lambda n, r: f"first iteration at {r['first_iteration_s']:6.1f}s  {r}")
        med = {n: {k: benchkit.median(v, k) for k in ("first_iteration_s", "imports", "ray.init", "build",
                                                       "first-sample")} for n, v in runs.items()}
        report["trainer"] = {"median": med, "runs": runs, "ratio_after_over_before": round(
            med["trainer"]["first_iteration_s"] / med[f"trainer@{args.baseline_rev}"]["first_iteration_s"], 3)}
    if not args.skip_probe:
        variants = {"serial, prestart on": (False, True), "serial, prestart off": (False, False),
                    "overlap, prestart on": (True, True), "overlap, prestart off": (True, False)}
        runs = benchkit.interleave({n: (lambda o=o, p=p: probe_run(o, p)) for n, (o, p) in variants.items()},
                                   args.rounds, lambda n, r: json.dumps(r))
        keys = ("python", "imports", "ray.init", "build", "before_first_sample", "first_iteration")
        med = {n: {k: benchkit.median(v, k) for k in keys} for n, v in runs.items()}
        ref = med["serial, prestart on"]["before_first_sample"]
        report["probe"] = {"median": med, "runs": runs,
                           "ratio_vs_serial_prestart_on": {n: round(m["before_first_sample"] / ref, 3)
                                                           for n, m in med.items()}}
        benchkit.bar_png("startup_bench", "process start -> first sample (median), by start-up variant",
                         list(med), [m["before_first_sample"] for m in med.values()], "seconds",
                         peer=report["goal_s_before_first_sample"], peer_label="goal 5 s")
    report["machine"] = benchkit.machine(load)
    benchkit.write("startup_bench", report)
    print(json.dumps({k: v.get("median") for k, v in report.items() if isinstance(v, dict) and "median" in v},
                     indent=1))


if __name__ == "__main__":
    main()
