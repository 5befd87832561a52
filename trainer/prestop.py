"""Head-pod preStop hook: stop this cluster's running Ray jobs gracefully before Kubernetes stops the head.

Deleting, evicting or preempting the head pod sends SIGTERM to the container's first process (`ray start --block`),
which does not pass it on to job drivers: the trainer would be SIGKILLed with the pod and lose everything since its
last periodic checkpoint. Run as the head container's `lifecycle.preStop` (the chart does), this asks Ray's job API
to stop every running job first: Ray sends each driver SIGTERM (trainer.signals: finish the iteration, checkpoint,
exit 143) and SIGKILL after RAY_JOB_STOP_WAIT_TIME_S. It returns once every job has ended, or after --timeout-s.
A RayJob retry (backoffLimit) then resumes from the checkpoint just written.

It never blocks the pod's termination on an error: if the job API cannot be reached it says so and exits 0.
Token auth: the Ray client reads RAY_AUTH_MODE / RAY_AUTH_TOKEN from the container's environment (KubeRay sets them).

    python -m trainer.prestop [--address http://127.0.0.1:8265] [--timeout-s 40]
"""

from __future__ import annotations

import argparse
import sys
import time


def _log(msg: str) -> None:
    print(f"[prestop] {msg}", file=sys.stderr, flush=True)


def stop_jobs(address: str, timeout_s: float) -> dict[str, str]:
    """Stops every RUNNING/PENDING job; -> submission id -> final (or last seen) status."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(address)
    live = [j.submission_id for j in client.list_jobs()
            if j.submission_id and j.status in (JobStatus.RUNNING, JobStatus.PENDING)]
    for sid in live:
        client.stop_job(sid)
        _log(f"stopping job {sid} (SIGTERM to its driver)")
    deadline = time.monotonic() + timeout_s
    while True:
        status = {sid: client.get_job_status(sid) for sid in live}
        if all(s.is_terminal() for s in status.values()) or time.monotonic() > deadline:
            return {sid: str(s.value) for sid, s in status.items()}
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.prestop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", default="http://127.0.0.1:8265", help="Ray dashboard/job API (default: %(default)s)")
    p.add_argument("--timeout-s", type=float, default=40.0, help="wait at most this long for the jobs to end")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    try:
        final = stop_jobs(args.address, args.timeout_s)
    except Exception as e:  # never hold the pod's termination on a hook error
        _log(f"could not stop jobs through {args.address}: {type(e).__name__}: {e}")
        return 0
    took = time.monotonic() - t0
    if not final:
        _log("no running jobs")
    else:
        _log(f"jobs after {took:.1f}s: " + ", ".join(f"{k}={v}" for k, v in final.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
