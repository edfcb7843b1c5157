"""The machinery behind every call: one private asyncio loop for the process on a daemon
thread, where the grpc.aio channels live and every RPC runs; the three forms of a call
(blocking, ``_future``, ``_async``) built from one coroutine; and the Sequencer that sends a
TrainingClient's calls in the order they were submitted.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import os
import threading
from typing import Any, Callable, Concatenate, Coroutine, Optional, ParamSpec, Protocol, Tuple, TypeVar

import grpc

from .errors import StreambpError

P = ParamSpec("P")
R = TypeVar("R")


class _Loop:
    """The process's SDK event loop, on a daemon thread ("streambp-io"): every client's calls
    run here. One loop for the whole process because grpc.aio's completion queue is
    process-wide: each further loop would be woken by every event (grpc/grpc#25364)."""

    _shared: "Optional[_Loop]" = None
    _lock = threading.Lock()

    @classmethod
    def shared(cls) -> "_Loop":
        with cls._lock:
            if cls._shared is None or cls._shared.pid != os.getpid():  # a forked child starts its own
                cls._shared = cls()
            return cls._shared

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name="streambp-io", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.set_exception_handler(_quiet_poller)
        self.loop.run_forever()


def _quiet_poller(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    # grpc.aio's poller, when another loop of the process (the user's) also uses grpc.aio, is
    # woken for events that loop takes first: harmless, but logged as BlockingIOError.
    if isinstance(context.get("exception"), BlockingIOError) and "PollerCompletionQueue" in repr(context.get("handle")):
        return
    loop.default_exception_handler(context)


class Runtime:
    """One client's use of the SDK's event loop: submits coroutines to it and waits for them
    from other threads, and refuses new calls once closed. Thread-safe."""

    def __init__(self) -> None:
        self._shared = _Loop.shared()
        self.loop = self._shared.loop
        self._closed = False

    def check_open(self) -> None:
        """Raises StreambpError(CANCELLED) once the client is closed."""
        if self._closed:
            raise StreambpError(grpc.StatusCode.CANCELLED, "the client is closed")

    def submit(self, coro: Coroutine[Any, Any, R]) -> "concurrent.futures.Future[R]":
        """Runs ``coro`` on the loop; its result or exception arrives in the returned Future."""
        if self._closed:
            coro.close()
            self.check_open()
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def wait(self, future: "concurrent.futures.Future[R]") -> R:
        """The result of a submitted call, blocking the calling thread (not the loop's)."""
        if threading.current_thread() is self._shared.thread:
            future.cancel()
            raise RuntimeError("a blocking streambp call from the SDK's own I/O thread (e.g. inside an on_progress "
                               "callback) would deadlock: use the _future or _async form there")
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            raise

    def run(self, coro: Coroutine[Any, Any, R]) -> R:
        """submit + wait."""
        return self.wait(self.submit(coro))

    def close(self) -> None:
        """Refuses further calls (StreambpError CANCELLED); the loop goes on for other clients."""
        self._closed = True


# --- Ordering ------------------------------------------------------------------------------

class _Slot:
    """A call's place in its Sequencer: it is sent once the previous call is released."""

    def __init__(self, previous: "Optional[concurrent.futures.Future[None]]") -> None:
        self.previous = previous
        self.released: "concurrent.futures.Future[None]" = concurrent.futures.Future()

    def release(self) -> None:
        if not self.released.done():
            self.released.set_result(None)


_CURRENT_SLOT: "contextvars.ContextVar[Optional[_Slot]]" = contextvars.ContextVar("streambp_slot", default=None)


class Sequencer:
    """Sends calls to the server in the order they were submitted (``take`` runs in the
    submitting thread, so the order is that of the calls, whatever thread makes them).

    A call is sent once the previous one is *released*: when the server has queued it (the
    first message of a progress stream: ``release_order``) or, for calls without such an
    acknowledgement, when it has finished. The server runs a session's requests in arrival
    order, so futures submitted in order are applied in order, while the server's queue
    stays full (8 forward_backward futures are all queued at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tail: "Optional[concurrent.futures.Future[None]]" = None

    def take(self) -> _Slot:
        with self._lock:
            slot = _Slot(self._tail)
            self._tail = slot.released
        return slot

    async def run(self, slot: _Slot, coro: Coroutine[Any, Any, R]) -> R:
        started = False
        try:
            if slot.previous is not None:
                await asyncio.wrap_future(slot.previous)
            token = _CURRENT_SLOT.set(slot)
            try:
                started = True
                return await coro
            finally:
                _CURRENT_SLOT.reset(token)
        finally:
            if not started:
                coro.close()
            slot.release()


def release_order() -> None:
    """Inside an ordered call: the server has queued it, so the next call may be sent."""
    slot = _CURRENT_SLOT.get()
    if slot is not None:
        slot.release()


# --- The three forms of a call ---------------------------------------------------------------

class HasRuntime(Protocol):
    _runtime: Runtime


S = TypeVar("S", bound=HasRuntime)

def call_forms(impl: "Callable[Concatenate[S, P], Coroutine[Any, Any, R]]", ordered: bool = False) -> Tuple[
        "Callable[Concatenate[S, P], R]",
        "Callable[Concatenate[S, P], concurrent.futures.Future[R]]",
        "Callable[Concatenate[S, P], Coroutine[Any, Any, R]]"]:
    """(blocking, future, async) methods from the coroutine ``impl`` (named ``_name``):

    - ``name(...)`` waits for the result;
    - ``name_future(...)`` submits the call and returns a ``concurrent.futures.Future``;
    - ``name_async(...)`` is a coroutine on the caller's event loop (the call itself runs on
      the SDK's grpc.aio loop), submitted when the coroutine starts.

    With ``ordered``, the call takes its place in the object's Sequencer when submitted."""
    name = impl.__name__.lstrip("_")

    def future(self: S, *args: P.args, **kwargs: P.kwargs) -> "concurrent.futures.Future[R]":
        self._runtime.check_open()
        coro = impl(self, *args, **kwargs)
        if ordered:
            sequencer: Sequencer = getattr(self, "_sequencer")
            coro = sequencer.run(sequencer.take(), coro)
        return self._runtime.submit(coro)

    def blocking(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._runtime.wait(future(self, *args, **kwargs))

    async def asynchronous(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.wrap_future(future(self, *args, **kwargs))

    doc = impl.__doc__ or ""
    order = (" Calls of one TrainingClient are sent in submission order." if ordered else "")
    for fn, suffix, note in (
            (blocking, "", "Blocks until the result (see also %s_future, %s_async)." % (name, name)),
            (future, "_future", "Submits %s and returns a concurrent.futures.Future of its result." % name),
            (asynchronous, "_async", "Awaitable form of %s (submitted when the coroutine starts)." % name)):
        functools.update_wrapper(fn, impl)
        fn.__name__ = name + suffix
        fn.__qualname__ = impl.__qualname__.rsplit(".", 1)[0] + "." + name + suffix if "." in impl.__qualname__ \
            else name + suffix
        fn.__doc__ = doc.rstrip() + "\n\n" + note + order + "\n"
    return blocking, future, asynchronous

