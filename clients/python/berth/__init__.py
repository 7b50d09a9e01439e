"""Berth client: asyncio, pure Python, written from docs/PROTOCOL.md."""

from .client import AckMode, Connection, Consumer, ExchangeKind, Message, Overflow, connect
from .errors import (
    BerthError,
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
    UnexpectedError,
    VersionError,
)

__version__ = "0.1.0"

__all__ = [
    "AckMode", "Connection", "Consumer", "ExchangeKind", "Message", "Overflow", "connect",
    "BerthError", "ConnectError", "ConnectionClosedError", "FrameTooLargeError",
    "HeartbeatTimeoutError", "InternalError", "InvalidError", "MalformedError",
    "NotAllowedError", "NotFoundError", "OutcomeUnknownError", "PreconditionFailedError",
    "ProtocolError", "ResourceLimitError", "ShutdownError", "StoreError", "UnexpectedError",
    "VersionError",
]
