"""The Ray Serve application: one ingress deployment that serves every configured policy over JSON HTTP.

Why a plain `__call__(Request)` and not FastAPI: with `RAY_SERVE_THROUGHPUT_OPTIMIZED=1` the replica answers
HTTP itself on the event loop, and a hand-rolled router keeps the request path at ~1 ms on 2 cores where a
FastAPI ingress measured ~20% slower. The OpenAPI document is written by hand in `serving/openapi.py`.

Everything a deployment needs to know comes from `user_config` (serving/config.py; serve_config.yaml), so a new
checkpoint, batch size or limit is applied by `reconfigure` in the running replicas: no restart, no downtime.
Checkpoints may be local paths or URIs (s3://, gs://, ...): remote ones are downloaded into a per-replica cache
directory ($RL_PLATFORM_CHECKPOINT_CACHE, else the temp dir) holding one copy per served policy; a copy is
deleted when its policy is replaced or removed, and when the replica stops.

A policy name may serve a champion and a candidate (split or shadow traffic, sticky sessions, episode feedback,
per-version figures): that logic lives in `serving/versions.py`; this module parses requests and routes to it.
Transition logging (`user_config.log`) lives in `serving/transitions.py`: one log per replica, handed to the
policies.

A configured policy that is not served yet answers 503 `loading` (with Retry-After) while its checkpoint loads and
503 `load_failed` (with the error) once it could not load; 404 `unknown_policy` is for names not configured.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import tempfile
import time
from typing import Any, Mapping

from ray import serve
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from rl_checkpoint import redact
from serving.config import ServerConfig, ServerKnobs
from serving.errors import ApiError, CheckpointError, bad_request
from serving.metrics import ServerMetrics
from serving.policy import LoadedPolicy
from serving.transitions import TransitionLog
from serving.versions import Loaded, PolicyVersions, load_versions

logger = logging.getLogger("ray.serve")

_POLICY_PATH = re.compile(r"^/v1/policies/([^/]+)(/act|/act_batch|/feedback|/stats|/sessions/[^/]+)?/?$")
_ENDPOINTS = {"/act": "act", "/act_batch": "act_batch", "/feedback": "feedback", "/stats": "stats"}
_JSON = "application/json"
LOADING_RETRY_AFTER_S = 2  # Retry-After of a 503 `loading`: checkpoints take seconds to load


# ------------------------------------------------------------------------------------------------ helpers


def _json_response(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        json.dumps(body, separators=(",", ":"), allow_nan=False).encode(), status_code=status,
        media_type=_JSON, headers=dict(headers) if headers else None,
    )


# ------------------------------------------------------------------------------------------------ deployment


@serve.deployment(name="PolicyServer")
class PolicyServer:
    def __init__(self, torch_threads: int | None = None):
        import torch

        # One replica = one CPU by default; more intra-op threads only oversubscribe a shared node.
        threads = int(torch_threads or os.environ.get("RL_SERVE_TORCH_THREADS", "1"))
        torch.set_num_threads(threads)
        # Per policy name: its champion, optional candidate, sticky sessions and figures (serving/versions.py).
        self._policies: dict[str, PolicyVersions] = {}
        self._config: ServerConfig | None = None
        self._metrics = ServerMetrics()
        self._reload_lock = asyncio.Lock()
        self._reload_errors: dict[str, dict[str, Any]] = {}
        self._loading: set[str] = set()  # configured names not served yet whose checkpoints are loading now
        self._log: TransitionLog | None = None  # user_config.log
        self._acting = 0  # act requests in progress in this replica (between body read and response)
        self._config_error: str | None = None
        self._started = time.time()
        cache_root = os.environ.get("RL_PLATFORM_CHECKPOINT_CACHE") or tempfile.gettempdir()
        os.makedirs(cache_root, exist_ok=True)
        self._cache_dir = tempfile.mkdtemp(prefix="rl-platform-replica-", dir=cache_root)
        try:
            self._replica = serve.get_replica_context().replica_id.unique_id
        except Exception:  # outside a Serve replica (never in production)
            self._replica = f"{os.uname().nodename}-{os.getpid()}"

    def __del__(self) -> None:  # Serve calls it when the replica stops
        log = getattr(self, "_log", None)
        if log is not None:  # open sessions' pending steps (truncated) and what waits get written
            for vs in self._policies.values():
                vs.stop()
            log.close()
        shutil.rmtree(getattr(self, "_cache_dir", ""), ignore_errors=True)

    # -------------------------------------------------------------- config / reload

    async def reconfigure(self, user_config: Mapping[str, Any]) -> None:
        """Apply a new user_config: (re)load changed checkpoints off the event loop, then swap atomically.

        Requests keep being served by the old modules while new ones load. A replica that already serves
        must not raise here: Serve stops a replica whose reconfigure fails, which would turn a bad checkpoint
        into an outage. So once serving, a config or checkpoint that cannot be applied leaves the previous
        policy in place (a policy the reload adds is left out: 404 with `detail.reload_error`) and is reported
        instead (GET /v1/policies[/name] `reload_error`, /readyz `errors`,
        `ray_rl_serve_policy_reloads_total{result="error"}`, the replica log). The first configuration has
        nothing to fall back to, so its errors are raised and fail the deployment with a readable message.
        """
        first = self._config is None
        cfg = self._parse(user_config, first)
        if cfg is None:
            return
        async with self._reload_lock:
            self._loading = set(cfg.policies) - set(self._policies)
            try:
                new, errors = await self._load_changed(cfg, first)
            finally:
                self._loading = set()
            old_log = self._apply_log(cfg)
            self._swap(cfg, new, errors)
        if old_log is not None:  # its last rows are written off the event loop
            await asyncio.to_thread(old_log.close)

    def _apply_log(self, cfg: ServerConfig) -> TransitionLog | None:
        """Start, keep (flushing it) or replace the transition log. -> the log to close, if one was replaced."""
        old = self._log
        if old is not None and old.cfg == cfg.log:
            old.writer.flush()
            return None
        self._log = TransitionLog(cfg.log, self._replica, self._metrics) if cfg.log.enabled else None
        return old

    def _parse(self, user_config: Mapping[str, Any], first: bool) -> ServerConfig | None:
        """The validated config, or None (after reporting) when a serving replica must keep its current one."""
        try:
            cfg = ServerConfig.parse(user_config)
        except ValueError as e:
            if first:
                raise
            logger.error("rejected user_config, keeping the previous one: %s", e)
            self._config_error = str(e)
            return None
        self._config_error = None
        return cfg

    async def _load_changed(self, cfg: ServerConfig, first: bool) -> tuple[dict[str, Loaded], dict[str, Any]]:
        """-> (versions per name: newly loaded or the current objects, reload errors per name).

        A champion that cannot load keeps the policy's current versions (or leaves a new name out); a candidate
        that cannot load is reported on the policy itself (`candidate_error`) while its champion serves."""
        new: dict[str, Loaded] = {}
        errors: dict[str, dict[str, Any]] = {}
        try:
            for name, ckpt in cfg.policies.items():
                cur = self._policies.get(name)
                try:
                    new[name] = await load_versions(name, ckpt, cfg.candidates.get(name), cur, cfg.limits,
                                                    self._cache_dir, self._metrics)
                except CheckpointError as e:
                    self._metrics.reload(name, ok=False)
                    logger.error("policy %r: %s", name, e)
                    errors[name] = {"checkpoint": redact(ckpt), "error": str(e), "at": time.time()}
                    if first:  # requests until Serve replaces the replica get 503 load_failed
                        self._reload_errors = errors
                        raise CheckpointError(f"policy {name!r}: {e}") from None
                    if cur is not None:  # keep serving what it serves (champion, candidate and weights)
                        new[name] = Loaded(cur.champion.pol, cur.candidate.pol if cur.candidate else None,
                                           cur.spec, cur.candidate_error)
                    # else: a policy this reload adds is not served; the others are (raising would stop them)
        except BaseException:
            served = {id(p) for vs in self._policies.values() for p in vs.policies()}
            for loaded in new.values():
                for pol in (loaded.champion, loaded.candidate):
                    if pol is not None and id(pol) not in served:
                        pol.release()
            raise
        return new, errors

    def _swap(self, cfg: ServerConfig, new: dict[str, Loaded], errors: dict[str, Any]) -> None:
        """Serve `new` from now on; report the change; drop what the old policies held."""
        replaced: list[LoadedPolicy] = []
        for name, loaded in new.items():
            vs = self._policies.get(name)
            if vs is None:
                vs = self._policies[name] = PolicyVersions(name, self._metrics, cfg.limits, cfg.max_batch_size,
                                                           cfg.batch_wait_timeout_s)
            else:
                vs.batcher.configure(cfg.max_batch_size, cfg.batch_wait_timeout_s)
            old = vs.champion.pol if vs.champion else None
            pol = loaded.champion
            replaced += vs.apply(loaded, cfg.limits)
            if old is not pol:
                self._metrics.loaded(self._info_tags(pol), self._info_tags(old) if old else None,
                                     pol.source.evaluation)
                logger.warning("policy %r serves checkpoint %s (%s) loaded in %.2fs",
                               name, pol.checkpoint_id, pol.checkpoint, pol.load_seconds)
        for gone in set(self._policies) - set(new):
            vs = self._policies.pop(gone)
            self._metrics.loaded(self._metrics.info_tags(gone, "-", None), self._info_tags(vs.champion.pol))
            vs.stop()
            replaced += vs.policies()
        for vs in self._policies.values():
            vs.log = self._log
        self._config = cfg
        self._reload_errors = errors
        for old in replaced:  # in-flight requests hold the module itself, not its downloaded files
            old.release()

    def _info_tags(self, pol: LoadedPolicy) -> dict[str, str]:
        return self._metrics.info_tags(pol.name, pol.checkpoint_id, pol.env, pol.source.registry)

    async def check_health(self) -> None:
        if self._config is None:
            raise RuntimeError("no user_config applied: configure user_config.policies")

    # -------------------------------------------------------------- HTTP

    async def __call__(self, request: Request) -> Response:
        t0 = time.perf_counter()
        policy, endpoint = "-", "not_found"
        try:
            scope = request.scope
            path = scope["path"]  # request.url would build a URL object per request
            root = scope.get("root_path") or ""
            if root and path.startswith(root):
                path = path[len(root):] or "/"
            method = request.method
            m = _POLICY_PATH.match(path)
            if m:
                name, sub = m.group(1), m.group(2) or ""
                vs = self._policies.get(name)
                endpoint = _ENDPOINTS.get(sub, "session" if sub.startswith("/sessions/") else "policy")
                if vs is None:
                    self._not_served(name)
                policy = name
                if endpoint == "act":
                    self._allow(method, "POST")
                    self._acting += 1
                    try:
                        resp = _json_response(await vs.act(await self._json_body(request), t0, self._batch_now))
                    finally:
                        self._acting -= 1
                elif endpoint == "act_batch":
                    self._allow(method, "POST")
                    resp = _json_response(vs.act_batch(await self._json_body(request), t0))
                elif endpoint == "feedback":
                    self._allow(method, "POST")
                    limit = self._config.max_batch_items if self._config else 1024
                    resp = _json_response(vs.feedback(await self._json_body(request), limit))
                elif endpoint == "stats":
                    self._allow(method, "GET")
                    resp = _json_response(vs.stats(self._replica))
                elif endpoint == "session":
                    self._allow(method, "DELETE")
                    sid = sub[len("/sessions/"):]
                    resp = _json_response({"session_id": sid, "ended": vs.end_session(sid)})
                else:
                    self._allow(method, "GET")
                    resp = _json_response(self._info(vs))
            elif path in ("/v1/policies", "/v1/policies/"):
                endpoint = "policies"
                self._allow(method, "GET")
                resp = _json_response({"policies": [self._info(vs) for vs in self._policies.values()]})
            elif path == "/healthz":
                endpoint = "healthz"
                self._allow(method, "GET")
                resp = _json_response({"status": "ok", "uptime_s": round(time.time() - self._started, 3),
                                       "acting": self._acting})
            elif path == "/readyz":
                endpoint = "readyz"
                self._allow(method, "GET")
                resp = self._readyz()
            elif path == "/openapi.json":
                endpoint = "openapi"
                self._allow(method, "GET")
                from serving.openapi import openapi_document

                resp = _json_response(openapi_document(sorted(self._policies)))
            else:
                raise ApiError(404, "not_found", f"no route {method} {path}; see GET /openapi.json")
        except ApiError as e:
            resp = _json_response(e.body(), e.status, e.headers)
        except Exception:  # a bug on our side: answer 500 with JSON, log it, keep serving
            logger.exception("policy server: unhandled error on %s %s", request.method, request.scope.get("path"))
            resp = _json_response({"error": {"code": "internal_error", "message": "internal server error"}}, 500)
        self._metrics.request(policy, endpoint, resp.status_code, (time.perf_counter() - t0) * 1e3)
        return resp

    def _not_served(self, name: str) -> None:
        """Raise why `name` is not served: still loading (503), failed to load (503), not configured (404)."""
        if name in self._loading:
            raise ApiError(503, "loading", f"policy {name!r} is configured and its checkpoint is still loading; "
                                           f"retry in a few seconds",
                           headers={"Retry-After": str(LOADING_RETRY_AFTER_S)})
        failed = self._reload_errors.get(name)
        if failed is not None:  # configured, but its checkpoint did not load: a new config (reload) can fix it
            msg = f"policy {name!r} is not served, its checkpoint did not load: {failed['error']}"
            raise ApiError(503, "load_failed", msg, {"reload_error": failed})
        raise ApiError(404, "unknown_policy", f"no policy named {name!r}; serving: {sorted(self._policies)}")

    @staticmethod
    def _allow(method: str, allowed: str) -> None:
        if method != allowed and not (allowed == "GET" and method == "HEAD"):
            raise ApiError(405, "method_not_allowed", f"use {allowed} here, not {method}", {"allow": allowed},
                           headers={"Allow": allowed})

    async def _json_body(self, request: Request) -> dict[str, Any]:
        # A declared non-JSON body (a form post, text/plain) is refused before it is read; no header = JSON assumed.
        ctype = request.headers.get("content-type")
        if ctype is not None:
            media = ctype.split(";", 1)[0].strip().lower()
            if media != _JSON and not (media.startswith("application/") and media.endswith("+json")):
                raise ApiError(415, "unsupported_media_type", f"Content-Type {media or ctype!r} is not {_JSON}")
        knobs = self._config.server if self._config else ServerKnobs()
        limit = knobs.max_body_bytes
        cl = request.headers.get("content-length")
        if cl is not None:
            # uvicorn (every ingress mode here) refuses a malformed Content-Length itself with a plain-text 400
            # before this runs (serving/README.md, "Errors"); this check covers servers that pass one through.
            if not (cl.isascii() and cl.isdigit()):
                raise bad_request("bad_content_length", f"Content-Length {cl!r} is not a number")
            if int(cl) > limit:  # refused before reading: the client need not send it
                raise ApiError(413, "body_too_large", f"body of {int(cl)} bytes exceeds the limit of {limit} bytes")
        chunks, size = [], 0
        try:
            # The server waits for as many bytes as Content-Length declares; a client that sends fewer and
            # waits for an answer would hold the request open forever.
            async with asyncio.timeout(knobs.body_timeout_s):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise ApiError(413, "body_too_large", f"body exceeds the limit of {limit} bytes")
                    chunks.append(chunk)
        except TimeoutError:
            declared = f" of the {cl} declared by Content-Length" if cl is not None else ""
            raise ApiError(408, "body_timeout",
                           f"the body did not arrive within {knobs.body_timeout_s:g}s: got {size} bytes{declared}",
                           headers={"Connection": "close"}) from None  # the rest of that body must not be parsed
        except ClientDisconnect:  # gone before the body was complete: no one to answer; counted as 499
            raise ApiError(499, "client_disconnected",
                           f"the client closed the connection after {size} bytes of the body") from None
        raw = b"".join(chunks)
        if not raw:
            raise bad_request("empty_body", "expected a JSON object body")
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise bad_request("invalid_json", f"body is not valid JSON: {str(e)[:200]}") from None
        if not isinstance(body, dict):
            raise bad_request("bad_body", f"expected a JSON object, got {type(body).__name__}")
        return body

    async def _batch_now(self) -> bool:
        """Whether an act request joins the dynamic batch (after validation, just before the forward)."""
        if self._config is not None and self._config.max_batch_size <= 1:
            return False
        # One event-loop turn lets requests that arrived together reach this point too. If this request is
        # still alone, the serve.batch queue hop (~0.2-0.4 ms here) would only add latency: run it directly.
        await asyncio.sleep(0)
        return self._acting > 1

    def _info(self, vs: PolicyVersions) -> dict[str, Any]:
        info = vs.info()
        if vs.name in self._reload_errors:
            info["reload_error"] = self._reload_errors[vs.name]
        return info

    def _readyz(self) -> Response:
        if self._config is None or not self._policies:
            body = {"status": "not_ready", "reason": "no policy loaded"}
            if self._loading:
                body["loading"] = sorted(self._loading)
            return _json_response(body, 503)
        body: dict[str, Any] = {"status": "ready",
                                "policies": {n: vs.champion.pol.checkpoint_id for n, vs in self._policies.items()}}
        # Still ready (serving the previous checkpoints), but say what could not be applied.
        errors = {n: e["error"] for n, e in self._reload_errors.items()}
        errors.update({f"{n}/candidate": vs.candidate_error["error"] for n, vs in self._policies.items()
                       if vs.candidate_error})
        if self._config_error:
            errors["user_config"] = self._config_error
        if errors:
            body["errors"] = errors
        return _json_response(body)


def build_app(args: Mapping[str, Any] | None = None) -> serve.Application:
    """Application builder for `import_path: serving.app:build_app` (args: {torch_threads: N})."""
    args = dict(args or {})
    return PolicyServer.bind(torch_threads=args.get("torch_threads"))


app = PolicyServer.bind()
