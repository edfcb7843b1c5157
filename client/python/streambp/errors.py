"""The one exception the SDK raises: StreambpError, with the gRPC status code and the server's message."""
from __future__ import annotations

from typing import Optional

import grpc

__all__ = ["StreambpError"]


class StreambpError(Exception):
    """An RPC failed, or input was refused before it was sent.

    ``code`` is the gRPC status code (``grpc.StatusCode``) and ``message`` the server's
    message as it sent it (for client-side checks, e.g. a bad JSONL line, the SDK's own
    message with the code the server would have used: INVALID_ARGUMENT, NOT_FOUND, ...).
    ``request_id`` is the id a mutating call carried, when it had one: repeating the call
    with it is safe (the server applies a request id once).

    The codes the server uses: INVALID_ARGUMENT for bad input (the message names the
    field), FAILED_PRECONDITION for the wrong state (e.g. custom-loss weights computed at
    an older policy version), NOT_FOUND, RESOURCE_EXHAUSTED (too large, queue full),
    DEADLINE_EXCEEDED, UNAVAILABLE (after the retries), UNAUTHENTICATED /
    PERMISSION_DENIED.
    """

    def __init__(self, code: grpc.StatusCode, message: str, request_id: Optional[str] = None):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError, request_id: Optional[str] = None) -> "StreambpError":
        """The StreambpError of a failed gRPC call (grpc.RpcError or grpc.aio.AioRpcError)."""
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN, details or "", request_id)

    def __reduce__(self):  # picklable (e.g. across multiprocessing)
        return (StreambpError, (self.code, self.message, self.request_id))


def invalid(message: str) -> StreambpError:
    """INVALID_ARGUMENT raised by a client-side check."""
    return StreambpError(grpc.StatusCode.INVALID_ARGUMENT, message)
