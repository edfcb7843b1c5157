"""ServiceClient: the connection to a streambp-server, server-level calls (info, sessions,
text) and the factory of TrainingClients."""
from __future__ import annotations

import asyncio
import os
import weakref
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

import grpc
import grpc.aio
from google.protobuf.message import Message

from ._connection import Connection, RetryPolicy, TlsConfig, new_request_id
from ._runtime import call_forms
from .data import TextLike, text_input, text_inputs, to_message
from .errors import StreambpError, invalid
from .training import TrainingClient
from .types import ServerInfo, SessionInfo, SessionList, TokenizedText, from_proto
from .v1 import trainer_pb2 as pb

__all__ = ["ServiceClient"]

#: A config message (LoraConfig, TrainingConfig, RolloutConfig) or a dict of its fields.
ConfigLike = Union[Message, Mapping[str, Any]]


class ServiceClient:
    """A connection to streambp-server (one gRPC channel; thread-safe).

    ``target`` is HOST:PORT; ``token`` a bearer token; ``tls`` None (plaintext), True (TLS
    with the system's roots) or a TlsConfig (own roots, mutual TLS). ``timeout`` is the
    default deadline of steps and other long calls, ``info_timeout`` that of quick reads
    (seconds; every call also takes ``timeout=``). ``retry`` retries UNAVAILABLE on the
    channel with the same request (and request id); None turns retries off.
    ``wait_for_ready`` makes calls wait for the server (until their deadline) instead of
    failing at once while it is unreachable. ``options`` are extra gRPC channel options and
    ``interceptors`` grpc.aio client interceptors (tracing, metrics).

    Every call comes in three forms: ``name(...)`` blocks, ``name_future(...)`` returns a
    ``concurrent.futures.Future`` and ``name_async(...)`` is a coroutine. All run on the
    SDK's grpc.aio event loop (one thread per process); errors raise StreambpError. Close the client (or use it as a
    context manager) to release the channel."""

    def __init__(self, target: str, token: Optional[str] = None, tls: Union[None, bool, TlsConfig] = None, *,
                 timeout: float = 600.0, info_timeout: float = 30.0, max_message_bytes: int = 64 << 20,
                 retry: Optional[RetryPolicy] = RetryPolicy(), wait_for_ready: bool = False,
                 options: Sequence[Tuple[str, Any]] = (), interceptors: Sequence[grpc.aio.ClientInterceptor] = ()):
        self._conn = Connection(target, token, tls, timeout, info_timeout, max_message_bytes, retry, wait_for_ready,
                                options, interceptors)
        self._runtime = self._conn.runtime
        self._close = weakref.finalize(self, self._conn.close)  # also when collected or at exit
        self.target = target

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled. Idempotent."""
        self._close()

    def __enter__(self) -> "ServiceClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def _wait_ready(self, timeout: float = 30.0) -> None:
        """Waits until the channel is connected (the server is up); UNAVAILABLE after ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._conn.channel.channel_ready(), timeout)
        except asyncio.TimeoutError:
            raise StreambpError(grpc.StatusCode.UNAVAILABLE,
                                f"no server at {self.target} after {timeout:g} s") from None

    wait_ready, wait_ready_future, wait_ready_async = call_forms(_wait_ready)

    def training_client(self, session: str = "", *, pipeline: bool = True) -> TrainingClient:
        """A TrainingClient of ``session`` ("" = the default session of a server without
        sessions: the whole model); ``pipeline`` see TrainingClient. No call is made."""
        return TrainingClient(self, session, pipeline)

    async def _create_training_client(self, name: str, **session: Any) -> TrainingClient:
        """Creates session ``name`` (the arguments of create_session) and returns its TrainingClient."""
        await self._create_session(name, **session)
        return TrainingClient(self, name)

    create_training_client, create_training_client_future, create_training_client_async = call_forms(
        _create_training_client)

    # -- info -----------------------------------------------------------------------------
    async def _info(self, session: str = "", *, timeout: Optional[float] = None) -> ServerInfo:
        """GetInfo: the model, dtype, device, engine and chunk sizes, policy version, limits and
        tokenizer; with ``session`` also that session's state (ServerInfo.session)."""
        response = await self._conn.unary("GetInfo", pb.GetInfoRequest(session=session),
                                          timeout or self._conn.info_timeout)
        return from_proto(ServerInfo, response)

    info, info_future, info_async = call_forms(_info)

    # -- sessions -------------------------------------------------------------------------
    async def _create_session(self, name: str, *, lora: Optional[ConfigLike] = None,
                              adapter: Union[str, "os.PathLike[str]", pb.PeftAdapter, None] = None, full: bool = False,
                              training: Optional[ConfigLike] = None, rollouts: Optional[ConfigLike] = None,
                              request_id: Optional[str] = None, timeout: Optional[float] = None) -> SessionInfo:
        """CreateSession: a new session ``name`` with exactly one of ``lora`` (a LoraConfig
        message or dict, e.g. {"r": 8}), ``adapter`` (a PEFT adapter folder to start from, or a
        PeftAdapter message) or ``full=True`` (full fine-tuning, where the server allows it);
        ``training`` (TrainingConfig: optimizer, schedule, clipping, seed) and ``rollouts``
        (RolloutConfig) as messages or dicts. Mutating (request id)."""
        if [lora is not None, adapter is not None, bool(full)].count(True) != 1:
            raise invalid("create_session: give exactly one of lora=, adapter= or full=True")
        request = pb.CreateSessionRequest(request_id=request_id or new_request_id(), name=name)
        if lora is not None:
            request.lora.CopyFrom(to_message(lora, pb.LoraConfig, "lora"))
        elif adapter is not None:
            request.adapter.CopyFrom(adapter if isinstance(adapter, pb.PeftAdapter) else _read_adapter(adapter))
        else:
            request.full = True
        if training is not None:
            request.training.CopyFrom(to_message(training, pb.TrainingConfig, "training"))
        if rollouts is not None:
            request.rollouts.CopyFrom(to_message(rollouts, pb.RolloutConfig, "rollouts"))
        response = await self._conn.unary("CreateSession", request, timeout, request.request_id)
        return from_proto(SessionInfo, response)

    create_session, create_session_future, create_session_async = call_forms(_create_session)

    async def _get_session(self, name: str, *, timeout: Optional[float] = None) -> SessionInfo:
        """GetSession: a session's kind, adapter, step, policy version, residency and sizes."""
        response = await self._conn.unary("GetSession", pb.GetSessionRequest(name=name),
                                          timeout or self._conn.info_timeout)
        return from_proto(SessionInfo, response)

    get_session, get_session_future, get_session_async = call_forms(_get_session)

    async def _list_sessions(self, *, timeout: Optional[float] = None) -> SessionList:
        """ListSessions: the sessions this token may see, and the server's session limits."""
        response = await self._conn.unary("ListSessions", pb.ListSessionsRequest(), timeout or self._conn.info_timeout)
        return from_proto(SessionList, response)

    list_sessions, list_sessions_future, list_sessions_async = call_forms(_list_sessions)

    async def _delete_session(self, name: str, *, request_id: Optional[str] = None,
                              timeout: Optional[float] = None) -> str:
        """DeleteSession: removes the session, its state and queued rollouts (not its
        checkpoints); returns its name. Mutating (request id)."""
        request = pb.DeleteSessionRequest(request_id=request_id or new_request_id(), name=name)
        response = await self._conn.unary("DeleteSession", request, timeout, request.request_id)
        return str(response.name)

    delete_session, delete_session_future, delete_session_async = call_forms(_delete_session)

    # -- text -----------------------------------------------------------------------------
    async def _tokenize(self, inputs: Union[TextLike, Sequence[TextLike]], *, add_special_tokens: bool = False,
                        add_generation_prompt: bool = False, enable_thinking: Optional[bool] = None,
                        timeout: Optional[float] = None) -> List[TokenizedText]:
        """Tokenize with the model's tokenizer and chat format: ``inputs`` is one string, one
        conversation (a list of {"role", "content"} messages) or a list of those; one
        TokenizedText each (ids; for conversations the loss mask of the trained assistant
        tokens and the rendered text). FAILED_PRECONDITION when the model has no tokenizer."""
        request = pb.TokenizeRequest(inputs=[text_input(t, enable_thinking) for t in text_inputs(inputs)],
                                     add_special_tokens=add_special_tokens,
                                     add_generation_prompt=add_generation_prompt)
        response = await self._conn.unary("Tokenize", request, timeout)
        return [from_proto(TokenizedText, o) for o in response.outputs]

    tokenize, tokenize_future, tokenize_async = call_forms(_tokenize)

    async def _tokenize_batch(self, batch: pb.Batch, *, timeout: Optional[float] = None) -> pb.Batch:
        """The batch with its text forms resolved to ids (and loss masks) exactly as a step
        would train on them."""
        response = await self._conn.unary("Tokenize", pb.TokenizeRequest(batch=batch), timeout)
        return response.batch

    tokenize_batch, tokenize_batch_future, tokenize_batch_async = call_forms(_tokenize_batch)

    async def _detokenize(self, sequences: Sequence[Sequence[int]], *, skip_special_tokens: bool = False,
                          timeout: Optional[float] = None) -> List[str]:
        """Detokenize: the text of each token sequence."""
        request = pb.DetokenizeRequest(sequences=[pb.TokenSequence(tokens=list(s)) for s in sequences],
                                       skip_special_tokens=skip_special_tokens)
        response = await self._conn.unary("Detokenize", request, timeout)
        return list(response.texts)

    detokenize, detokenize_future, detokenize_async = call_forms(_detokenize)


def _read_adapter(folder: Union[str, "os.PathLike[str]"]) -> pb.PeftAdapter:
    """The two files of a PEFT adapter folder."""
    try:
        with open(os.path.join(folder, "adapter_config.json"), encoding="utf-8") as f:
            config = f.read()
        with open(os.path.join(folder, "adapter_model.safetensors"), "rb") as f:
            weights = f.read()
    except OSError as e:
        raise StreambpError(grpc.StatusCode.NOT_FOUND, f"adapter folder {os.fspath(folder)}: {e}") from None
    return pb.PeftAdapter(adapter_config_json=config, adapter_model_safetensors=weights)
