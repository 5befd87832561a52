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
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "rl-platform policy server",
            "version": "1",
            "description": (
                "Greedy actions from RLlib policies loaded from checkpoints. Observations are JSON arrays "
                "(nested lists) or {b64, dtype, shape} objects. Frame-stacked policies (Pong) also accept one "
                "frame per request with a session_id; the server keeps the stack."
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
                              "404": client_errors["404"]},
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
                    "policy": {"type": "string"}, "checkpoint_id": {"type": "string"}}}), **client_errors},
            }},
            "/v1/policies/{name}/sessions/{session_id}": {"delete": {
                "summary": "Drop a frame-stacking session (optional; idle sessions expire)",
                "parameters": [name_param, {"name": "session_id", "in": "path", "required": True,
                                            "schema": {"type": "string"}}],
                "responses": {"200": _ok("Ended", {"type": "object", "properties": {
                    "session_id": {"type": "string"}, "ended": {"type": "boolean"}}}), "404": client_errors["404"]},
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
                "session_id": {"type": "string", "minLength": 1, "maxLength": SESSION_ID_MAX_LEN},
                "reset": {"type": "boolean", "default": False,
                          "description": "Start a new episode: the stack restarts zero-filled."}}},
            "Action": {"description": "int (Discrete), list of int (MultiDiscrete) or list of number (Box).",
                       "oneOf": [{"type": "integer"}, {"type": "array", "items": {"type": "number"}}]},
            "ActResponse": {"type": "object", "required": ["action", "policy", "checkpoint_id"], "properties": {
                "action": {"$ref": "#/components/schemas/Action"},
                "policy": {"type": "string"}, "checkpoint_id": {"type": "string"},
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
                               "frame": {"type": "object"}}},
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                "type": "object", "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "detail": {}}}}},
        }},
    }


if __name__ == "__main__":
    print(json.dumps(openapi_document(), indent=2))
