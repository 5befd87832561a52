"""The policy server's OpenAPI 3.1 document (served at GET /openapi.json, also `python -m serving.openapi`)."""

from __future__ import annotations

import json
from typing import Any

from serving.config import B64_DTYPES, NAME_PATTERN, SESSION_ID_MAX_LEN

_ERR = {"$ref": "#/components/schemas/Error"}


def _err(desc: str) -> dict[str, Any]:
    return {"description": desc, "content": {"application/json": {"schema": _ERR}}}


def _ok(desc: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": desc, "content": {"application/json": {"schema": schema}}}


def openapi_document(policy_names: list[str] | None = None) -> dict[str, Any]:
    from serving.policy import METADATA_SOURCES

    name_schema: dict[str, Any] = {"type": "string", "pattern": NAME_PATTERN}
    if policy_names:
        name_schema["examples"] = list(policy_names)
    name_param = {"name": "name", "in": "path", "required": True, "schema": name_schema,
                  "description": "Policy name as configured in user_config.policies."}
    client_errors = {
        "400": {
            "description": (
                "Malformed request: invalid JSON, not an object, missing or unknown field (JSON Error). A request "
                "the HTTP server cannot frame never reaches the policy server and gets the HTTP server's own answer, "
                "with the connection closed: a Content-Length that is not a plain decimal (letters, sign, empty, "
                "comma list, beyond 64 bits), two Content-Length headers, Content-Length with Transfer-Encoding, "
                "or bytes beyond Content-Length: uvicorn's text/plain 'Invalid HTTP request received.'."
            ),
            "content": {"application/json": {"schema": _ERR},
                        "text/plain": {"schema": {"type": "string", "const": "Invalid HTTP request received."}}},
        },
        "404": _err("Unknown policy."),
        "408": _err("The body did not arrive within body_timeout_s of the headers (fewer bytes than Content-Length "
                    "declares); the connection is closed."),
        "413": _err("Body larger than max_body_bytes (by Content-Length, before the body is read, or while it "
                    "streams), or batch larger than max_batch_items."),
        "415": _err("Content-Type given and not JSON (application/json or application/*+json); no header: JSON assumed."),
        "422": _err("Observation does not fit the policy's observation space (shape, dtype, NaN/inf, bounds)."),
        "503": {**_err("The policy is configured but not served yet: `loading` (its checkpoint is loading; retry "
                       "after Retry-After seconds) or `load_failed` (its checkpoint did not load: "
                       "`detail.reload_error`; a new config can fix it). Names not configured get 404."),
                "headers": {"Retry-After": {"description": "With `loading`: seconds to wait before retrying.",
                                            "schema": {"type": "integer"}}}},
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "rl-platform policy server",
            "version": "1",
            "description": (
                "Greedy actions from RLlib policies loaded from checkpoints. Observations are JSON arrays "
                "(nested lists) or {b64, dtype, shape} objects. Frame-stacked policies (Pong) also accept one "
                "frame per request with a session_id; the server keeps the stack. A policy may serve a candidate "
                "next to its champion (split: a share of sessions; shadow: mirrored off the critical path); every "
                "answer names the version that acted, and /feedback credits episode returns to it."
            ),
        },
        "paths": {
            "/v1/policies": {"get": {
                "summary": "List served policies",
                "responses": {"200": _ok("Policies", {"type": "object", "properties": {
                    "policies": {"type": "array", "items": {"$ref": "#/components/schemas/PolicyInfo"}}}})},
            }},
            "/v1/policies/{name}": {"get": {
                "summary": "Describe one policy",
                "parameters": [name_param],
                "responses": {"200": _ok("Policy", {"$ref": "#/components/schemas/PolicyInfo"}),
                              "404": client_errors["404"], "503": client_errors["503"]},
            }},
            "/v1/policies/{name}/act": {"post": {
                "summary": "Greedy action for one observation (or one frame of a session)",
                "parameters": [name_param],
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/ActRequest"},
                    "examples": {"cartpole": {"value": {"observation": [0.01, -0.02, 0.03, 0.04]}},
                                 "pong_session": {"value": {"session_id": "game-1", "reset": True,
                                                            "frame": {"b64": "...", "dtype": "uint8",
                                                                      "shape": [2, 210, 160, 3]}}}},
                }}},
                "responses": {"200": _ok("Action", {"$ref": "#/components/schemas/ActResponse"}), **client_errors},
            }},
            "/v1/policies/{name}/act_batch": {"post": {
                "summary": "Greedy actions for a batch of observations",
                "parameters": [name_param],
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"type": "object", "required": ["observations"], "additionalProperties": False,
                               "properties": {"observations": {"$ref": "#/components/schemas/Array"}}},
                    "examples": {"cartpole": {"value": {"observations": [[0.0, 0.0, 0.0, 0.0], [0.1, 0.0, -0.1, 0.0]]}}},
                }}},
                "responses": {"200": _ok("Actions", {"type": "object", "properties": {
                    "actions": {"type": "array", "items": {"$ref": "#/components/schemas/Action"}},
                    "policy": {"type": "string"}, "checkpoint_id": {"type": "string"},
                    "version": {"$ref": "#/components/schemas/VersionRole"}}}), **client_errors},
            }},
            "/v1/policies/{name}/feedback": {"post": {
                "summary": "Rewards of sessions that acted: done=true ends the episode and credits its return to "
                           "the version the session was assigned to",
                "parameters": [name_param],
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"oneOf": [{"$ref": "#/components/schemas/Feedback"},
                                         {"type": "object", "required": ["feedback"], "additionalProperties": False,
                                          "properties": {"feedback": {
                                              "type": "array", "minItems": 1,
                                              "items": {"$ref": "#/components/schemas/Feedback"},
                                              "description": "At most max_batch_items items; validated as a "
                                                             "whole before any is applied."}}}]},
                    "examples": {"step": {"value": {"session_id": "ep-1", "reward": 1.0}},
                                 "last_step": {"value": {"session_id": "ep-1", "reward": 1.0, "done": True}},
                                 "batch": {"value": {"feedback": [{"session_id": "ep-1", "reward": 1.0},
                                                                  {"session_id": "ep-2", "reward": 0.5,
                                                                   "done": True}]}}},
                }}},
                "responses": {
                    "200": _ok("Accepted", {"type": "object", "required": ["accepted", "episodes_ended"],
                                            "properties": {"accepted": {"type": "integer"},
                                                           "episodes_ended": {"type": "integer"}}}),
                    **client_errors,
                    "404": _err("Unknown policy, or `unknown_session`: the session never acted on this policy in "
                                "this replica, or expired (idle over session_ttl_s, evicted beyond max_sessions)."),
                    "409": _err("`session_ended`: the session already ended (done=true or DELETE)."),
                    "422": _err("`bad_reward` (not a finite number), `bad_done` / `bad_truncated` (not a boolean, or "
                                "`truncated` without done=true), `bad_observation` (`observation` without done=true, "
                                "null, or not fitting the policy like an act input), `empty_batch`."),
                },
            }},
            "/v1/policies/{name}/stats": {"get": {
                "summary": "This replica's figures per version (champion, candidate) since each loaded",
                "parameters": [name_param],
                "responses": {"200": _ok("Stats", {"$ref": "#/components/schemas/PolicyStats"}),
                              "404": client_errors["404"], "503": client_errors["503"]},
            }},
            "/v1/policies/{name}/sessions/{session_id}": {"delete": {
                "summary": "End a session: its version assignment and frame stack are dropped (optional; idle "
                           "sessions expire). Its unfinished episode is not counted.",
                "parameters": [name_param, {"name": "session_id", "in": "path", "required": True,
                                            "schema": {"type": "string"}}],
                "responses": {"200": _ok("Ended", {"type": "object", "properties": {
                    "session_id": {"type": "string"}, "ended": {"type": "boolean"}}}), "404": client_errors["404"],
                    "503": client_errors["503"]},
            }},
            "/healthz": {"get": {"summary": "Liveness: the replica answers",
                                 "responses": {"200": _ok("Alive", {"type": "object", "properties": {
                                     "status": {"type": "string"}, "uptime_s": {"type": "number"},
                                     "acting": {"type": "integer", "description":
                                                "act requests this replica is answering now"}}})}}},
            "/readyz": {"get": {"summary": "Readiness: every configured policy is loaded",
                                "responses": {"200": _ok("Ready", {"type": "object"}),
                                              "503": _ok("Not ready", {"type": "object"})}}},
            "/openapi.json": {"get": {"summary": "This document",
                                      "responses": {"200": _ok("OpenAPI 3.1", {"type": "object"})}}},
        },
        "components": {"schemas": {
            "Array": {"description": "Nested JSON list of numbers, or a base64-encoded array.",
                      "oneOf": [{"type": "array"}, {"$ref": "#/components/schemas/EncodedArray"}]},
            "EncodedArray": {"type": "object", "required": ["b64", "shape"], "additionalProperties": False,
                             "properties": {"b64": {"type": "string", "contentEncoding": "base64"},
                                            "dtype": {"type": "string", "default": "float32",
                                                      "enum": list(B64_DTYPES)},
                                            "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}}}},
            "ActRequest": {"type": "object", "additionalProperties": False, "properties": {
                "observation": {"$ref": "#/components/schemas/Array",
                                "description": "One observation of the policy's observation_space shape."},
                "frame": {"$ref": "#/components/schemas/Array",
                          "description": "Frame-stacked policies: one preprocessed frame (frame.shape) or, for "
                                         "Atari, raw RGB uint8 values: the last two frames of a frame skip (2, H, W, 3), "
                                         "preprocessed then maxed as in training, or one frame (H, W, 3)."},
                "session_id": {"type": "string", "minLength": 1, "maxLength": SESSION_ID_MAX_LEN,
                               "description": "An episode's id: required with 'frame', optional with "
                                              "'observation'. The session keeps the version (champion or "
                                              "candidate) of its first request until it ends, and is what "
                                              "/feedback credits rewards to."},
                "reset": {"type": "boolean", "default": False,
                          "description": "Start a new episode in the session: the stack restarts zero-filled and "
                                         "unreported reward is dropped (the version is kept)."}}},
            "VersionRole": {"type": "string", "enum": ["champion", "candidate"],
                            "description": "Which version under the policy name acted."},
            "Feedback": {"type": "object", "required": ["session_id", "reward"], "additionalProperties": False,
                         "properties": {
                             "session_id": {"type": "string", "minLength": 1, "maxLength": SESSION_ID_MAX_LEN},
                             "reward": {"type": "number", "description": "Finite; accumulates per session."},
                             "done": {"type": "boolean", "default": False,
                                      "description": "The episode ended: its return is counted, the session ends."},
                             "truncated": {"type": "boolean", "default": False,
                                           "description": "With done=true: the episode was cut short (a time "
                                                          "limit), not terminated. Recorded in the transition log."},
                             "observation": {"$ref": "#/components/schemas/Array",
                                             "description": "With done=true: the episode's final observation (a "
                                                            "frame for sessions that send frames). Recorded as the "
                                                            "last transition's new_obs in the transition log."}}},
            "Latency": {"type": "object", "description": "Cumulative histogram (ms), Prometheus style: counts[i] "
                                                         "requests took <= le[i].",
                        "properties": {"le": {"type": "array"}, "counts": {"type": "array", "items": {"type": "integer"}},
                                       "sum": {"type": "number"}, "count": {"type": "integer"}}},
            "VersionStats": {"type": "object", "properties": {
                "checkpoint_id": {"type": "string"}, "weight": {"type": "number"},
                "mode": {"type": ["string", "null"], "enum": ["split", "shadow", None]},
                "requests": {"type": "integer"}, "errors": {"type": "integer"},
                "latency_ms": {"$ref": "#/components/schemas/Latency"},
                "episodes": {"type": "integer"}, "return_sum": {"type": "number"},
                "return_sq_sum": {"type": "number"}, "active_sessions": {"type": "integer"},
                "shadow": {"type": "object", "description": "candidate only", "properties": {
                    "compared": {"type": "integer"}, "agreed": {"type": "integer"}, "dropped": {"type": "integer"},
                    "errors": {"type": "integer"}}}}},
            "PolicyStats": {"type": "object", "required": ["policy", "replica", "at", "versions"], "properties": {
                "policy": {"type": "string"}, "replica": {"type": "string"}, "at": {"type": "number"},
                "versions": {"type": "object", "required": ["champion"], "properties": {
                    "champion": {"$ref": "#/components/schemas/VersionStats"},
                    "candidate": {"$ref": "#/components/schemas/VersionStats"}}},
                "rollout": {"type": ["object", "null"], "description": "the candidate's rollout state as configured"},
                "candidate_error": {"type": "object"}}},
            "Action": {"description": "int (Discrete), list of int (MultiDiscrete) or list of number (Box).",
                       "oneOf": [{"type": "integer"}, {"type": "array", "items": {"type": "number"}}]},
            "ActResponse": {"type": "object", "required": ["action", "policy", "checkpoint_id", "version"],
                            "properties": {
                "action": {"$ref": "#/components/schemas/Action"},
                "policy": {"type": "string"}, "checkpoint_id": {"type": "string", "description":
                                                                "the checkpoint of the version that acted"},
                "version": {"$ref": "#/components/schemas/VersionRole"},
                "session": {"type": "object", "properties": {"id": {"type": "string"}, "new": {"type": "boolean"},
                                                             "frames": {"type": "integer"}}}}},
            "Space": {"type": "object", "required": ["type"], "properties": {
                "type": {"type": "string", "enum": ["Box", "Discrete", "MultiDiscrete"]},
                "shape": {"type": "array", "items": {"type": "integer"}}, "dtype": {"type": "string"},
                "low": {"description": "number, null (unbounded) or list"}, "high": {}, "n": {"type": "integer"},
                "start": {"type": "integer"}, "nvec": {"type": "array", "items": {"type": "integer"}}}},
            "PolicyInfo": {"type": "object", "required": ["name", "checkpoint_id", "observation_space", "action_space"],
                           "properties": {
                               "name": {"type": "string"}, "checkpoint_id": {"type": "string"},
                               "version": {"type": "string", "description": "Same as checkpoint_id."},
                               "checkpoint": {"type": "string"},
                               "metadata_source": {"type": "string", "enum": list(METADATA_SOURCES)},
                               "env": {"type": ["string", "null"]}, "algo": {"type": ["string", "null"]},
                               "iteration": {"type": ["integer", "null"]}, "framestack": {"type": "integer"},
                               "observation_space": {"$ref": "#/components/schemas/Space"},
                               "action_space": {"$ref": "#/components/schemas/Space"},
                               "frame": {"type": "object"},
                               "candidate": {"type": ["object", "null"], "description":
                                             "the candidate served next to this champion: checkpoint_id, "
                                             "checkpoint, weight, mode (split|shadow), registry, evaluation"},
                               "candidate_error": {"type": "object", "description":
                                                   "the configured candidate did not load: checkpoint, error, at"}}},
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                "type": "object", "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "detail": {}}}}},
        }},
    }


if __name__ == "__main__":
    print(json.dumps(openapi_document(), indent=2))
