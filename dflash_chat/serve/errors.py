"""Errors as OpenAI's API writes them: {"error": {"message", "type", "param", "code"}}, never a traceback."""

from __future__ import annotations

import logging

log = logging.getLogger("dflash_chat.serve")


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


SERVER_FAULT = "The server failed on this request; its log says why. Try again, or report it."
SHUTTING_DOWN = "The server is shutting down; this answer was cut short. Try again when it is back."


def log_refusal(method: str, path: str, error: ApiError) -> None:
    """A client's error: one line in the server's log, never a traceback."""
    log.warning("%s %s %s: %s", error.status, method, path, error.message)
