"""Berth client: asyncio, pure Python, written from docs/PROTOCOL.md."""

from .client import AckMode, Connection, Consumer, ExchangeKind, Message, Overflow, connect
from .errors import (
    AuthFailedError,
    BerthError,
    ClosedOutcomeUnknownError,
    ConnectError,
    ConnectionClosedError,
    FrameTooLargeError,
    HeartbeatTimeoutError,
    InternalError,
    InvalidError,
    MalformedError,
    NotAllowedError,
    NotFoundError,
    OutcomeUnknownError,
    PreconditionFailedError,
    ProtocolError,
    ResourceLimitError,
    ShutdownError,
    StoreError,
    UnavailableError,
    UnexpectedError,
    VersionError,
    carried_out,
)

__version__ = "0.1.0"

__all__ = [
    "AckMode", "Connection", "Consumer", "ExchangeKind", "Message", "Overflow", "connect",
    "AuthFailedError", "BerthError", "ClosedOutcomeUnknownError", "ConnectError",
    "ConnectionClosedError", "FrameTooLargeError",
    "HeartbeatTimeoutError", "InternalError", "InvalidError", "MalformedError",
    "NotAllowedError", "NotFoundError", "OutcomeUnknownError", "PreconditionFailedError",
    "ProtocolError", "ResourceLimitError", "ShutdownError", "StoreError", "UnavailableError",
    "UnexpectedError", "VersionError", "carried_out",
]
