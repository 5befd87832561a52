"""Where the desired state lives and how it is changed: the Serve config file of a local `python -m serving
--config FILE` (rewritten atomically; the server applies a changed file by itself), or the `serveConfigV2` of a
KubeRay RayService (patched alone, so KubeRay updates the Serve application in place on the same RayCluster).

Every change is `update(fn)`: read the config, `fn(config) -> new config` (or None: no change), write it, with no
lost update between writers (the controller, `rl-rollout abort` from another shell): a lock file beside a local
config; the RayService's resourceVersion as a precondition of the patch (a conflict re-reads and retries).

A finished rollout leaves no candidate in the config; its last record is kept for `status`: in
`.<config file name>.rollouts.json` beside a local config, in the annotation `rollout.rl-platform.io/<NAME>` of a
RayService (metadata: KubeRay does not act on it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import yaml

from rl_rollout.errors import RolloutError

Update = Callable[[dict[str, Any]], "dict[str, Any] | None"]


def dump_yaml(cfg: dict[str, Any]) -> str:
    return yaml.safe_dump(cfg, sort_keys=False, default_flow_style=False, width=10**6, allow_unicode=True)


def _load_yaml(text: str, where: str) -> dict[str, Any]:
    try:
        cfg = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RolloutError(f"{where} is not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(cfg, dict) or not cfg.get("applications"):
        raise RolloutError(f"{where}: not a Serve config (needs `applications:`)")
    return cfg


class LocalFile:
    """The Serve config file `python -m serving --config FILE` serves."""

    def __init__(self, path: str):
        self.path = Path(path).expanduser().resolve()
        if not self.path.is_file():
            raise RolloutError(f"--config {path!r}: no such file")
        self.kind = f"config {self.path}"
        self._lock = self.path.parent / f".{self.path.name}.lock"
        self._records = self.path.parent / f".{self.path.name}.rollouts.json"

    def read(self) -> dict[str, Any]:
        try:
            text = self.path.read_text()
        except OSError as e:
            raise RolloutError(f"cannot read {self.path}: {e.strerror}") from None
        return _load_yaml(text, str(self.path))

    @contextlib.contextmanager
    def locked(self):
        try:
            fd = os.open(self._lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RolloutError(f"cannot create the lock file {self._lock}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _write_text(self, path: Path, text: str) -> None:
        """tmp file in the same folder, fsync, rename: readers (the server's watcher) see the old or the new file."""
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise RolloutError(f"cannot write {path}: {e.strerror}") from None

    def _header(self) -> str:
        """The file's leading comment block, kept across rewrites (PyYAML drops comments)."""
        lines = []
        for line in self.path.read_text().splitlines():
            if not line.startswith("#"):
                break
            lines.append(line)
        return "\n".join(lines) + "\n" if lines else ""

    def update(self, fn: Update) -> dict[str, Any]:
        with self.locked():
            cfg = self.read()
            new = fn(cfg)
            if new is None:
                return cfg
            self._write_text(self.path, self._header() + dump_yaml(new))
            return new

    def read_record(self, name: str) -> dict[str, Any] | None:
        try:
            return json.loads(self._records.read_text()).get(name)
        except (OSError, ValueError, AttributeError):
            return None

    def write_record(self, name: str, record: dict[str, Any]) -> None:
        with self.locked():
            try:
                records = json.loads(self._records.read_text())
                records = records if isinstance(records, dict) else {}
            except (OSError, ValueError):
                records = {}
            records[name] = record
            self._write_text(self._records, json.dumps(records, indent=2, sort_keys=True) + "\n")

    def applied(self, since: Any) -> tuple[bool, str]:
        return True, ""  # nothing to ask a file; the server's policy info confirms

    def marker(self) -> Any:
        return None


ANNOTATION = "rollout.rl-platform.io/"


class RayService:
    """spec.serveConfigV2 of a KubeRay RayService, through the `kubernetes` client (kubeconfig as rl-submit)."""

    def __init__(self, name: str, namespace: str | None, kubeconfig: str | None, context: str | None):
        from rl_submit.cli import Problem, connect

        try:
            self.kube = connect(kubeconfig, context, namespace)
        except Problem as p:
            raise RolloutError(str(p)) from None
        self.name = name
        self.kind = f"rayservice {self.kube.namespace}/{name}"

    def _call(self, doing: str, fn, *args, **kw):
        from rl_submit.cli import NotFound, Problem, call

        try:
            return call(self.kube, doing, fn, *args, **kw)
        except NotFound as p:
            raise RolloutError(f"no RayService {self.name!r} in namespace {self.kube.namespace!r} ({p})") from None
        except Problem as p:
            raise RolloutError(str(p)) from None

    def get(self) -> dict[str, Any]:
        from rl_submit.cli import RAY

        return self._call("get rayservices.ray.io", self.kube.custom.get_namespaced_custom_object, *RAY,
                          self.kube.namespace, "rayservices", self.name)

    def _config(self, obj: dict[str, Any]) -> dict[str, Any]:
        text = (obj.get("spec") or {}).get("serveConfigV2")
        if not isinstance(text, str) or not text.strip():
            raise RolloutError(f"{self.kind} has no spec.serveConfigV2")
        return _load_yaml(text, f"{self.kind} spec.serveConfigV2")

    def read(self) -> dict[str, Any]:
        return self._config(self.get())

    def _patch(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """A merge patch; None when the resourceVersion precondition lost to another writer."""
        from kubernetes.client.rest import ApiException

        from rl_submit.cli import CONNECT_S, READ_S, RAY

        try:
            return self.kube.custom.patch_namespaced_custom_object(
                *RAY, self.kube.namespace, "rayservices", self.name, body, _request_timeout=(CONNECT_S, READ_S))
        except ApiException as e:
            if e.status == 409:
                return None
            from rl_submit.cli import explain
            raise RolloutError(str(explain(e, self.kube, "patch rayservices.ray.io"))) from None
        except Exception as e:
            from rl_submit.cli import explain
            raise RolloutError(str(explain(e, self.kube, "patch rayservices.ray.io"))) from None

    def update(self, fn: Update) -> dict[str, Any]:
        for _ in range(10):
            obj = self.get()
            cfg = self._config(obj)
            new = fn(cfg)
            if new is None:
                return cfg
            # Only serveConfigV2 changes: KubeRay re-applies the Serve config on the same RayCluster.
            body = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                    "spec": {"serveConfigV2": dump_yaml(new)}}
            if self._patch(body) is not None:
                return new
            time.sleep(0.2)
        raise RolloutError(f"{self.kind} kept changing under the controller (10 conflicting writes)")

    def read_record(self, name: str) -> dict[str, Any] | None:
        ann = (self.get().get("metadata") or {}).get("annotations") or {}
        try:
            return json.loads(ann[ANNOTATION + name[:63]])
        except (KeyError, ValueError):
            return None

    def write_record(self, name: str, record: dict[str, Any]) -> None:
        self._patch({"metadata": {"annotations": {ANNOTATION + name[:63]: json.dumps(record, sort_keys=True)}}})

    def marker(self) -> dict[str, Any]:
        """What the RayService looks like before a change: its generation and active RayCluster."""
        obj = self.get()
        st = obj.get("status") or {}
        return {"cluster": (st.get("activeServiceStatus") or {}).get("rayClusterName")}

    def applied(self, before: dict[str, Any] | None) -> tuple[bool, str]:
        """KubeRay reconciled the newest spec and the Serve application runs on the same RayCluster."""
        obj = self.get()
        st = obj.get("status") or {}
        gen, seen = obj["metadata"].get("generation"), st.get("observedGeneration")
        if gen is not None and (seen is None or seen < gen):
            return False, f"KubeRay has not reconciled generation {gen} yet (observed {seen})"
        active = st.get("activeServiceStatus") or {}
        pending = (st.get("pendingServiceStatus") or {}).get("rayClusterName")
        if pending:
            return False, f"KubeRay is preparing a new RayCluster {pending} (not an in-place update)"
        if before and before.get("cluster") and active.get("rayClusterName") != before["cluster"]:
            return False, f"the active RayCluster changed from {before['cluster']} to {active.get('rayClusterName')}"
        app_name = self._config(obj)["applications"][0].get("name", "default")
        app = (active.get("applicationStatuses") or {}).get(app_name) or {}
        if app and app.get("status") != "RUNNING":
            return False, f"Serve application {app_name!r} is {app.get('status')}: {app.get('message', '')}".strip()
        return True, ""
