"""Exceptions, each carrying the wire error code (PROTOCOL.md 1.4)."""

from __future__ import annotations

OK = 0
MALFORMED = 1
VERSION = 2
FRAME_TOO_LARGE = 3
NOT_FOUND = 4
PRECONDITION_FAILED = 5
RESOURCE_LIMIT = 6
NOT_ALLOWED = 7
STORE = 8
INVALID = 9
HEARTBEAT_TIMEOUT = 10
SHUTDOWN = 11
INTERNAL = 12
UNEXPECTED = 13

CODE_NAMES = {
    OK: "ok",
    MALFORMED: "malformed",
    VERSION: "version",
    FRAME_TOO_LARGE: "frame-too-large",
    NOT_FOUND: "not-found",
    PRECONDITION_FAILED: "precondition-failed",
    RESOURCE_LIMIT: "resource-limit",
    NOT_ALLOWED: "not-allowed",
    STORE: "store",
    INVALID: "invalid",
    HEARTBEAT_TIMEOUT: "heartbeat-timeout",
    SHUTDOWN: "shutdown",
    INTERNAL: "internal",
    UNEXPECTED: "unexpected",
}


def code_name(code: int | None) -> str:
    if code is None:
        return "none"
    return CODE_NAMES.get(code, f"code-{code}")


class BerthError(Exception):
    """A failure reported by the broker, or found by the client.

    ``code`` is the wire error code (None when there is none, e.g. a socket
    that closed without a CLOSE frame); ``command_id`` the failed command's
    id (0 for the connection).
    """

    def __init__(self, code: int | None, text: str = "", command_id: int = 0):
        self.code = code
        self.text = text
        self.command_id = command_id
        where = f" (command {command_id})" if command_id else ""
        super().__init__(f"{code_name(code)}{where}: {text}" if text else f"{code_name(code)}{where}")

    @property
    def code_name(self) -> str:
        return code_name(self.code)


class MalformedError(BerthError): ...
class VersionError(BerthError): ...
class FrameTooLargeError(BerthError): ...
class NotFoundError(BerthError): ...
class PreconditionFailedError(BerthError): ...
class ResourceLimitError(BerthError): ...
class NotAllowedError(BerthError): ...
class StoreError(BerthError): ...
class InvalidError(BerthError): ...
class HeartbeatTimeoutError(BerthError): ...
class ShutdownError(BerthError): ...
class InternalError(BerthError): ...
class UnexpectedError(BerthError): ...


_BY_CODE = {
    MALFORMED: MalformedError,
    VERSION: VersionError,
    FRAME_TOO_LARGE: FrameTooLargeError,
    NOT_FOUND: NotFoundError,
    PRECONDITION_FAILED: PreconditionFailedError,
    RESOURCE_LIMIT: ResourceLimitError,
    NOT_ALLOWED: NotAllowedError,
    STORE: StoreError,
    INVALID: InvalidError,
    HEARTBEAT_TIMEOUT: HeartbeatTimeoutError,
    SHUTDOWN: ShutdownError,
    INTERNAL: InternalError,
    UNEXPECTED: UnexpectedError,
}


def error_for(code: int, text: str = "", command_id: int = 0) -> BerthError:
    """The exception for an ERROR frame; unknown codes give a plain BerthError."""
    return _BY_CODE.get(code, BerthError)(code, text, command_id)


class ProtocolError(BerthError):
    """The server sent something the protocol does not allow; the client
    closes the connection with ``code``."""


class ConnectionClosedError(BerthError):
    """The session ended. ``code`` is the CLOSE frame's code, or None when
    the socket closed without one."""


class OutcomeUnknownError(ConnectionClosedError):
    """The session ended before this command was answered: it may or may
    not have taken effect (PROTOCOL.md 2.6)."""


class ConnectError(BerthError):
    """No address accepted the session. ``errors`` holds ``(address,
    exception)`` for each address tried, in order."""

    def __init__(self, errors: list[tuple[str, BaseException]]):
        self.errors = errors
        detail = "; ".join(f"{a}: {e!r}" for a, e in errors) or "no addresses given"
        last = errors[-1][1] if errors else None
        super().__init__(getattr(last, "code", None), f"could not connect: {detail}")
