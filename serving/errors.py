"""Client-facing errors: each carries the HTTP status and a machine-readable code.

Everything a client can get wrong is raised as an `ApiError`; the app turns it into a JSON body
`{"error": {"code": ..., "message": ..., "detail"?: ...}}`. Anything else is a server bug (500).
"""

from __future__ import annotations

from typing import Any, Mapping

from rl_checkpoint import CheckpointError  # noqa: F401  (the checkpoint contract's error, raised at deploy/reload)


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, detail: Any = None,
                 headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail
        self.headers = headers  # response headers that go with it (405: Allow; 408: Connection: close)

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.detail is not None:
            err["detail"] = self.detail
        return {"error": err}


def bad_request(code: str, message: str, detail: Any = None) -> ApiError:
    return ApiError(400, code, message, detail)


def unprocessable(code: str, message: str, detail: Any = None) -> ApiError:
    return ApiError(422, code, message, detail)
