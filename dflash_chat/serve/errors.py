"""Errors as OpenAI's API writes them: {"error": {"message", "type", "param", "code"}}, never a traceback."""

from __future__ import annotations

import logging

from dflash_chat.errors import one_line

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


LOGGED = "dflash_chat.logged"  # set in a request's scope once its failure has its line in the log


def one_line_failures(app):
    """`app` (FastAPI) with no failure left for the server to print as a traceback: Starlette answers an
    unexpected error with a 500 through the app's handler (which logs its one line and sets LOGGED), then
    re-raises it; mid-answer no handler runs, and the one line is written here."""

    async def wrapped(scope, receive, send):
        try:
            await app(scope, receive, send)
        except Exception as exc:  # noqa: BLE001 - see above: logged once, never a traceback
            if not scope.get(LOGGED):
                log.error("500 %s %s: %s", scope.get("method"), scope.get("path"), one_line(exc, "the answer"))

    return wrapped
