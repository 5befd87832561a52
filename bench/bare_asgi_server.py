"""Baseline for bench/serve_bench.py: a bare ASGI app on uvicorn doing the policy server's per-request work
(body limit, JSON parse, field check, serving.policy's observation validation, the served forward + greedy action,
the same JSON response), without Ray Serve. The gap between it and the Serve deployment is Serve's cost.

    .venv/bin/python bench/bare_asgi_server.py --checkpoint DIR --port PORT   (prints {"event": "ready"} when up)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serving.config import ServerKnobs  # noqa: E402
from serving.errors import ApiError, bad_request  # noqa: E402
from serving.policy import LoadedPolicy  # noqa: E402

FIELDS = ("observation",)


def make_app(pol: LoadedPolicy, path: str, limit: int):
    async def read_body(receive) -> bytes:
        chunks, size, more = [], 0, True
        while more:
            msg = await receive()
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise ApiError(413, "body_too_large", f"body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
            more = msg.get("more_body", False)
        return b"".join(chunks)

    def act(raw: bytes) -> dict:
        if not raw:
            raise bad_request("empty_body", "expected a JSON object body")
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise bad_request("invalid_json", f"body is not valid JSON: {str(e)[:200]}") from None
        if not isinstance(body, dict):
            raise bad_request("bad_body", f"expected a JSON object, got {type(body).__name__}")
        unknown = sorted(set(body) - set(FIELDS))
        if unknown or "observation" not in body:
            raise bad_request("unknown_field", f"fields {sorted(body)}; allowed: {list(FIELDS)}")
        obs = pol.observation(body["observation"])
        return {"action": pol.act(obs[None])[0], "policy": pol.name, "checkpoint_id": pol.checkpoint_id}

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        status = 200
        try:
            if scope["path"] != path or scope["method"] != "POST":
                raise ApiError(404, "not_found", f"POST {path} only")
            out = act(await read_body(receive))
        except ApiError as e:
            status, out = e.status, e.body()
        data = json.dumps(out, separators=(",", ":"), allow_nan=False).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    return app


def main() -> None:
    import torch
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--path", default="/v1/policies/default/act")
    args = ap.parse_args()
    torch.set_num_threads(1)
    pol = LoadedPolicy.load("default", args.checkpoint)
    config = uvicorn.Config(make_app(pol, args.path, ServerKnobs().max_body_bytes), host="127.0.0.1",
                            port=args.port, access_log=False, log_level="warning", loop="uvloop", http="httptools")
    server = uvicorn.Server(config)

    orig_startup = server.startup

    async def startup(sockets=None):
        await orig_startup(sockets)
        print(json.dumps({"event": "ready", "port": args.port}), flush=True)

    server.startup = startup  # type: ignore[method-assign]
    server.run()


if __name__ == "__main__":
    main()
