import faulthandler
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


# The order suites run in: the Python-only suites first, those that use the background builds (mk/k8s.mk
# TEST_BACKGROUND: chart tools, the cluster tier's binaries, the images) after them, `k8s` last. Files keep their
# names' order (tests/k8s relies on none: each test brings its preconditions).
SUITE_ORDER = ("unit", "trainer", "serving", "security", "chart", "containers", "monitoring", "k8s")
# `make test` runs two groups side by side (pytest-xdist, `--dist loadgroup`: one worker per group), laid out by what
# is cached (Makefile TEST_LAYOUT, passed as RLP_TEST_LAYOUT); without xdist (`TEST_WORKERS=0`) everything runs in
# SUITE_ORDER in one process.
# - `cached` (the cluster tier's binaries are built): `ray`, the suites that train and serve on a local Ray (the
#   CPU-heavy ones), beside `rest`: the unit and security suites, then those that use the builds and mostly wait on
#   pods. Balanced by measurement: with unit and security in the first group, a warm run ended its cluster-side
#   suites after 56 min and the Python ones after 83 (bench/results/make_test_side_by_side.json).
# - `cold` (a new machine: ~23 min of niced Go builds behind the suites): every Python suite one after the other in
#   `python`, beside `cluster`, which waits for the background run to build the tier's binaries without raising its
#   priority (the Python suites keep the CPU) and then runs the tier, which idles ~47 % of the CPU waiting on pods
#   (measured one after the other: bench/results/make_test_cold.json).
LAYOUTS = {
    "cached": {"ray": ("trainer", "serving"),
               "rest": ("unit", "security", "chart", "containers", "monitoring", "k8s")},
    "cold": {"python": ("unit", "trainer", "serving", "security", "chart", "containers", "monitoring"),
             "cluster": ("k8s",)},
}
for _groups in LAYOUTS.values():
    assert sorted(SUITE_ORDER) == sorted(s for suites in _groups.values() for s in suites)
LAYOUT = os.environ.get("RLP_TEST_LAYOUT") or "cached"
SUITE_GROUPS = LAYOUTS.get(LAYOUT, {})
# Modules of the `ray` group that run at the end of the `rest` group instead, after the cluster tier (and last when
# one process runs everything): CI's side-by-side run ended the cluster-side suites well before the Python ones
# (the `ray` group is the long pole), so the longest self-contained trainer module moves to the group that idles.
# In the cold layout the tier is the long pole: they stay at the end of the Python suites.
LAST_IN_REST = ("trainer/test_policy_lag.py",)
LAST_GROUP = "rest" if LAYOUT == "cached" else "python"


def _moved(item) -> bool:
    return Path(str(item.fspath)).as_posix().endswith(tuple(f"tests/{m}" for m in LAST_IN_REST))


def _suite(item) -> str | None:
    parts = Path(str(item.fspath)).relative_to(Path(__file__).resolve().parent).parts
    return parts[0] if len(parts) > 1 and parts[0] in SUITE_ORDER else None


def pytest_configure(config):
    if LAYOUT not in LAYOUTS:
        known = ", ".join(sorted(LAYOUTS))
        raise pytest.UsageError(f"RLP_TEST_LAYOUT={LAYOUT!r} (Makefile TEST_LAYOUT): one of {known}")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: len(SUITE_ORDER) + 1 if _moved(item)
               else SUITE_ORDER.index(s) if (s := _suite(item)) else len(SUITE_ORDER))  # stable
    for item in items:
        suite = _suite(item)
        group = LAST_GROUP if _moved(item) else next((g for g, suites in SUITE_GROUPS.items() if suite in suites),
                                                     LAST_GROUP)
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    # A suite's last test has run: its registered clean-ups (trainer_helpers.at_suite_end) run now, not at the end of
    # the session (the suites are contiguous: pytest_collection_modifyitems sorts by SUITE_ORDER).
    suite = _suite(item)
    if suite and nextitem is not None and _suite(nextitem) != suite:
        from trainer_helpers import SUITE_END

        for fn in reversed(SUITE_END.pop(suite, [])):
            fn()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    # A whole run once ended in a segmentation fault after its summary (interpreter shutdown: a C extension's
    # threads or atexit handlers), so `make test` failed with every test passed and nothing to go on. pytest's own
    # faulthandler is switched off by now; switched back on, such a crash prints every thread's Python stack.
    faulthandler.enable(file=sys.__stderr__, all_threads=True)


@pytest.fixture(autouse=True, scope="session")
def _interruptible_children():
    # A shell without job control starts background commands (`make test &`, `nohup ... &` in a CI script) with SIGINT
    # ignored, and an ignored signal stays ignored across exec: every process the tests start would then ignore the
    # Ctrl-C that the signal tests send (rl-rollout, the trainer, servers). A Python-level handler here is reset to the
    # default on exec, so children get a SIGINT that interrupts, as in a terminal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


@pytest.fixture(autouse=True, scope="session")
def _no_stray_ray_address():
    # Tests start their own Ray (embedded or ray.cluster_utils.Cluster); never a cluster found via RAY_ADDRESS.
    os.environ.pop("RAY_ADDRESS", None)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    yield


class LocalS3:
    """moto's S3-compatible server on 127.0.0.1: a real object store for output_dir / checkpoint URIs."""

    BUCKET = "rlp"
    CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

    def __init__(self, port: int):
        import pyarrow.fs as pafs

        self.port = port
        self.fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", access_key="testing",
                                    secret_key="testing", region="us-east-1", allow_bucket_creation=True)
        self.fs.create_dir(self.BUCKET)

    def uri(self, key: str) -> str:
        """s3://rlp/<key> with the options pyarrow needs to reach this server (credentials come from the env)."""
        return f"s3://{self.BUCKET}/{key}?endpoint_override=127.0.0.1:{self.port}&scheme=http"


@pytest.fixture(scope="session")
def s3():
    """One local S3 server per session; its credentials are in os.environ, so subprocesses (trainer, server,
    Ray workers) started after this fixture reach it too."""
    import subprocess

    from trainer_helpers import free_port, wait_for_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    saved = {k: os.environ.get(k) for k in LocalS3.CREDS}
    try:
        wait_for_port(port, proc, 60, "moto server")
        os.environ.update(LocalS3.CREDS)
        yield LocalS3(port)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="session")
def built_helm() -> str:
    """The pinned helm, once hack/tools.sh has built it (`make test` builds it in the background: this waits)."""
    from rl_submit.cli import Problem, find_helm

    build = subprocess.run([str(Path(__file__).resolve().parents[1] / "hack" / "tools.sh"), "helm"], capture_output=True, text=True)
    try:
        return find_helm(None)
    except Problem:
        msg = f"helm not built (`make tools`): hack/tools.sh helm exited {build.returncode}: {build.stderr[-1500:]}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg)
        pytest.skip(msg)
