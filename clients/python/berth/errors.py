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
AUTH_FAILED = 14
UNAVAILABLE = 15
OUTCOME_UNKNOWN = 16  # protocol 1.4: a 1.0 session gets UNAVAILABLE instead

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
    AUTH_FAILED: "auth-failed",
    UNAVAILABLE: "unavailable",
    OUTCOME_UNKNOWN: "outcome-unknown",
}

# What an ERROR with each code says of the command it answers
# (PROTOCOL.md 1.4, "carried out?"): "no" (nothing of it took effect),
# "unknown" (it may or may not have), or None (the code never answers a
# command). A code not listed is "unknown".
CARRIED_OUT = {
    OK: None,
    MALFORMED: "no",
    VERSION: "no",
    FRAME_TOO_LARGE: "no",
    NOT_FOUND: "no",
    PRECONDITION_FAILED: "no",
    RESOURCE_LIMIT: "no",
    NOT_ALLOWED: "no",
    STORE: "unknown",
    INVALID: "no",
    HEARTBEAT_TIMEOUT: None,
    SHUTDOWN: "no",
    INTERNAL: "unknown",
    UNEXPECTED: "no",
    AUTH_FAILED: "no",
    UNAVAILABLE: "no",  # in a session of 1.4; before, it may also mean "unknown"
    OUTCOME_UNKNOWN: "unknown",
}


def carried_out(code: int) -> str | None:
    """"no", "unknown" or None for ``code`` (see CARRIED_OUT)."""
    return CARRIED_OUT.get(code, "unknown")


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


class OutcomeUnknownError(BerthError):
    """The command may or may not have taken effect: sent again, it may be
    carried out twice (PROTOCOL.md 1.4). Raised as it is for the code
    outcome-unknown (16, protocol 1.4: the broker lost track of the command,
    its replicated queue's master was lost with it in flight) and for codes
    this client does not know; its subclasses are StoreError, InternalError
    and ClosedOutcomeUnknownError (the session ended before the answer).

    This client speaks protocol 1.0, in which the broker answers
    ``unavailable`` (UnavailableError) where a 1.4 session gets
    outcome-unknown, with the same text: only the text ("outcome is
    unknown", "may or may not") tells them apart."""


class MalformedError(BerthError): ...
class VersionError(BerthError): ...
class FrameTooLargeError(BerthError): ...
class NotFoundError(BerthError): ...
class PreconditionFailedError(BerthError): ...
class ResourceLimitError(BerthError): ...
class NotAllowedError(BerthError): ...
class StoreError(OutcomeUnknownError):
    """The journal failed: a publish's message is enqueued in memory and
    delivered, but may be gone after a restart."""
class InvalidError(BerthError): ...
class HeartbeatTimeoutError(BerthError): ...
class ShutdownError(BerthError): ...
class InternalError(OutcomeUnknownError): ...
class UnexpectedError(BerthError): ...
class AuthFailedError(BerthError): ...
class UnavailableError(BerthError):
    """Not taken now (a replicated queue's group has no master, too few
    replicas in sync, ...): retry. In a session before 1.4 (this client's)
    it may also mean that the outcome is unknown, which its text then
    says."""


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
    AUTH_FAILED: AuthFailedError,
    UNAVAILABLE: UnavailableError,
    OUTCOME_UNKNOWN: OutcomeUnknownError,
}


def error_for(code: int, text: str = "", command_id: int = 0) -> BerthError:
    """The exception for an ERROR frame; a code this client does not know
    gives an OutcomeUnknownError (PROTOCOL.md 1.4: treat it as a failure of
    unknown outcome)."""
    return _BY_CODE.get(code, OutcomeUnknownError)(code, text, command_id)


class ProtocolError(BerthError):
    """The server sent something the protocol does not allow; the client
    closes the connection with ``code``."""


class ConnectionClosedError(BerthError):
    """The session ended. ``code`` is the CLOSE frame's code, or None when
    the socket closed without one."""


class ClosedOutcomeUnknownError(OutcomeUnknownError, ConnectionClosedError):
    """The session ended before this command was answered: it may or may
    not have taken effect (PROTOCOL.md 2.6). Both an OutcomeUnknownError
    and a ConnectionClosedError."""


class ConnectError(BerthError):
    """No address accepted the session. ``errors`` holds ``(address,
    exception)`` for each address tried, in order."""

    def __init__(self, errors: list[tuple[str, BaseException]]):
        self.errors = errors
        detail = "; ".join(f"{a}: {e!r}" for a, e in errors) or "no addresses given"
        last = errors[-1][1] if errors else None
        super().__init__(getattr(last, "code", None), f"could not connect: {detail}")
