"""One grpc.aio channel to a server, on the SDK's private loop, and the ways to call it:
unary calls, step calls with progress, and server streams delivered to another thread or
loop. Errors come out as StreambpError."""
from __future__ import annotations

import asyncio
import json
import logging
import queue
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Generic, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

import grpc
import grpc.aio

from ._runtime import Runtime, release_order
from .errors import StreambpError, invalid
from .types import StepProgress, from_proto
from .v1 import trainer_pb2 as pb
from .v1 import trainer_pb2_grpc as pb_grpc

T = TypeVar("T")
log = logging.getLogger("streambp")

ProgressCallback = Callable[[StepProgress], None]


def new_request_id() -> str:
    """A random request id (128 bits, 32 hex digits)."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of UNAVAILABLE by the channel itself (gRPC's service-config retryPolicy): the
    same request, request id included, so a retried step is applied once. ``max_attempts``
    counts the first attempt (gRPC caps it at 5)."""
    max_attempts: int = 5
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    multiplier: float = 2.0

    def service_config(self) -> str:
        """The channel's service config (JSON) with this policy on every streambp.v1.Trainer method."""
        if not 2 <= self.max_attempts <= 5:
            raise invalid(f"retry.max_attempts must be in [2, 5] (gRPC's limit), got {self.max_attempts}")
        if not (0 < self.initial_backoff_s <= self.max_backoff_s) or self.multiplier < 1:
            raise invalid("retry: need 0 < initial_backoff_s <= max_backoff_s and multiplier >= 1")
        return json.dumps({"methodConfig": [{
            "name": [{"service": "streambp.v1.Trainer"}],
            "retryPolicy": {"maxAttempts": self.max_attempts, "initialBackoff": f"{self.initial_backoff_s}s",
                            "maxBackoff": f"{self.max_backoff_s}s", "backoffMultiplier": self.multiplier,
                            "retryableStatusCodes": ["UNAVAILABLE"]}}]})


@dataclass(frozen=True)
class TlsConfig:
    """TLS to the server. Each PEM is bytes, or a str: PEM text or the path of a PEM file.
    ``root_certificates`` None = the system's roots; ``private_key`` + ``certificate_chain``
    for mutual TLS; ``server_name`` overrides the name checked in the server's certificate."""
    root_certificates: Union[bytes, str, None] = None
    private_key: Union[bytes, str, None] = None
    certificate_chain: Union[bytes, str, None] = None
    server_name: Optional[str] = None

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel credentials."""
        if (self.private_key is None) != (self.certificate_chain is None):
            raise invalid("tls: give both private_key and certificate_chain (mutual TLS), or neither")
        return grpc.ssl_channel_credentials(_pem(self.root_certificates, "root_certificates"),
                                            _pem(self.private_key, "private_key"),
                                            _pem(self.certificate_chain, "certificate_chain"))


def _pem(value: Union[bytes, str, None], what: str) -> Optional[bytes]:
    if value is None or isinstance(value, bytes):
        return value
    if value.lstrip().startswith("-----BEGIN"):
        return value.encode()
    try:
        with open(value, "rb") as f:
            return f.read()
    except OSError as e:
        raise StreambpError(grpc.StatusCode.NOT_FOUND, f"tls.{what}: cannot read {value}: {e.strerror}") from None


# A step RPC -> its progress RPC and the field of StepProgress with its answer.
_PROGRESS = {"ForwardBackward": ("ForwardBackwardProgress", "forward_backward"),
             "TrainStep": ("TrainStepProgress", "train_step")}


class Connection:
    """The channel, the stub and the call defaults shared by a ServiceClient and its
    TrainingClients. Methods that return coroutines run on ``runtime``'s loop."""

    def __init__(self, target: str, token: Optional[str], tls: Union[None, bool, TlsConfig], timeout: float,
                 info_timeout: float, max_message_bytes: int, retry: Optional[RetryPolicy], wait_for_ready: bool,
                 options: Sequence[Tuple[str, Any]], interceptors: Sequence[grpc.aio.ClientInterceptor]):
        if not target:
            raise invalid("target is empty (expected HOST:PORT)")
        for name, value in (("timeout", timeout), ("info_timeout", info_timeout)):
            if not value > 0:
                raise invalid(f"{name} must be > 0 seconds, got {value}")
        if max_message_bytes <= 0:
            raise invalid(f"max_message_bytes must be > 0, got {max_message_bytes}")
        self.target = target
        self.timeout = timeout
        self.info_timeout = info_timeout
        self.wait_for_ready = wait_for_ready
        self.metadata: Tuple[Tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        channel_options: List[Tuple[str, Any]] = [("grpc.max_send_message_length", max_message_bytes),
                                                  ("grpc.max_receive_message_length", max_message_bytes)]
        if retry is not None:
            # gRPC keeps a request for a retry only up to its per-call retry buffer (256 KiB by
            # default): a larger batch would not be retried at all. Up to the message limit is.
            channel_options += [("grpc.enable_retries", 1), ("grpc.service_config", retry.service_config()),
                                ("grpc.per_rpc_retry_buffer_size", max_message_bytes),
                                ("grpc.retry_buffer_size", max(max_message_bytes, 256 << 20))]
        else:
            channel_options.append(("grpc.enable_retries", 0))
        credentials: Optional[grpc.ChannelCredentials] = None
        if tls is True or isinstance(tls, TlsConfig):
            config = tls if isinstance(tls, TlsConfig) else TlsConfig()
            credentials = config.credentials()
            if config.server_name:
                channel_options.append(("grpc.ssl_target_name_override", config.server_name))
        channel_options += list(options)
        self.runtime = Runtime()

        async def open_channel() -> grpc.aio.Channel:
            if credentials is None:
                return grpc.aio.insecure_channel(target, options=channel_options, interceptors=interceptors)
            return grpc.aio.secure_channel(target, credentials, options=channel_options, interceptors=interceptors)

        self.channel = self.runtime.run(open_channel())
        self.stub = pb_grpc.TrainerStub(self.channel)

    def close(self) -> None:
        """Closes the channel (cancelling calls in flight); later calls raise StreambpError(CANCELLED)."""
        try:
            self.runtime.run(self.channel.close())
        except (StreambpError, RuntimeError):  # closed already, or called from the loop's own thread
            pass
        self.runtime.close()

    def call_kwargs(self, timeout: Optional[float]) -> dict:
        """The keyword arguments of a stub call: deadline (None = none), metadata, wait_for_ready."""
        kwargs: dict = {"timeout": timeout, "metadata": self.metadata}
        if self.wait_for_ready:
            kwargs["wait_for_ready"] = True
        return kwargs

    async def unary(self, method: str, request: Any, timeout: Optional[float] = None,
                    request_id: Optional[str] = None) -> Any:
        """One unary call (``timeout`` None = the default step timeout)."""
        try:
            return await getattr(self.stub, method)(request, **self.call_kwargs(timeout or self.timeout))
        except grpc.aio.AioRpcError as e:
            raise StreambpError.from_rpc_error(e, request_id) from None

    async def step(self, method: str, request: Any, timeout: Optional[float], on_progress: Optional[ProgressCallback],
                   pipeline: bool) -> Any:
        """A ForwardBackward / TrainStep (``method``), answered with its response message.

        With ``pipeline`` it runs as ``method``Progress: the order is released at the stream's
        first message (the server has queued the step), progress goes to ``on_progress``, and
        the "done" message carries the answer. A server without the progress RPC
        (UNIMPLEMENTED) gets the unary call with the same request id. Without ``pipeline`` the
        unary call is made (the order is released when it finishes; no progress)."""
        if not pipeline:
            return await self.unary(method, request, timeout, request.request_id)
        progress_method, answer = _PROGRESS[method]
        call = getattr(self.stub, progress_method)(request, **self.call_kwargs(timeout or self.timeout))
        done: Optional[pb.StepProgress] = None
        try:
            async for message in call:
                release_order()
                if message.state == "done":
                    done = message
                elif on_progress is not None:
                    try:
                        on_progress(from_proto(StepProgress, message))
                    except Exception:  # a callback's bug must not lose the step's answer
                        log.exception("on_progress raised; the step goes on")
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                return await self.unary(method, request, timeout, request.request_id)
            raise StreambpError.from_rpc_error(e, request.request_id) from None
        finally:
            call.cancel()  # no-op once finished; stops the server's writes when we were cancelled
        if done is None:
            raise StreambpError(grpc.StatusCode.INTERNAL, f"{progress_method}: the stream ended without the answer",
                                request.request_id)
        return getattr(done, answer)


_END = object()


class StreamPump(Generic[T]):
    """Runs a server-streaming call on the runtime's loop and hands each converted message to
    ``deliver`` (from the loop's thread), then ``deliver(_END)`` or ``deliver(StreambpError)``."""

    def __init__(self, connection: Connection, open_call: Callable[[], Any], convert: Callable[[Any], T],
                 deliver: Callable[[Any], object]):
        self._open_call = open_call
        self._convert = convert
        self._deliver = deliver
        self.future = connection.runtime.submit(self._pump())

    async def _pump(self) -> None:
        call = self._open_call()
        try:
            async for message in call:
                self._deliver(self._convert(message))
            self._deliver(_END)
        except grpc.aio.AioRpcError as e:
            self._deliver(StreambpError.from_rpc_error(e))
        except asyncio.CancelledError:
            call.cancel()
            self._deliver(_END)
            raise

    def cancel(self) -> None:
        self.future.cancel()


class StreamIterator(Iterator[T]):
    """A blocking iterator over a server stream (e.g. watch_policy). ``close()`` (or leaving a
    ``with`` block) cancels the call; errors raise StreambpError from ``next``."""

    def __init__(self, connection: Connection, open_call: Callable[[], Any], convert: Callable[[Any], T]):
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._pump = StreamPump(connection, open_call, convert, self._queue.put)
        self._done = False

    def __iter__(self) -> "StreamIterator[T]":
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        item = self._queue.get()
        if item is _END or isinstance(item, StreambpError):
            self._done = True
            self._pump.cancel()
            if item is _END:
                raise StopIteration
            raise item
        return item

    def close(self) -> None:
        """Cancels the call; the iterator then ends."""
        self._done = True
        self._pump.cancel()

    def __enter__(self) -> "StreamIterator[T]":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


async def stream_async(connection: Connection, open_call: Callable[[], Any],
                       convert: Callable[[Any], T]) -> AsyncIterator[T]:
    """The same as an async iterator on the caller's loop (closing it cancels the call)."""
    loop = asyncio.get_running_loop()
    items: "asyncio.Queue[Any]" = asyncio.Queue()

    def deliver(item: Any) -> None:
        try:
            loop.call_soon_threadsafe(items.put_nowait, item)
        except RuntimeError:  # the caller's loop has closed: nobody is listening
            pass
    pump = StreamPump(connection, open_call, convert, deliver)
    try:
        while True:
            item = await items.get()
            if item is _END:
                return
            if isinstance(item, StreambpError):
                raise item
            yield item
    finally:
        pump.cancel()
