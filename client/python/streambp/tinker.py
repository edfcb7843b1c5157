"""Tinker's client surface over streambp-server: code written against Thinking Machines'
``tinker`` package ports by changing the import and the base URL::

    from streambp import tinker                    # instead of: import tinker
    from streambp.tinker import types              #             from tinker import types

    service = tinker.ServiceClient(base_url="127.0.0.1:50051")
    training = service.create_lora_training_client(base_model="...", rank=16)
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights})
    fb = training.forward_backward([datum], "cross_entropy")       # futures, as Tinker's
    opt = training.optim_step(types.AdamParams(learning_rate=1e-4))
    print(fb.result().metrics["loss:sum"]); opt.result()
    sampler = training.save_weights_and_get_sampling_client("step-10")
    out = sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=4,
                         sampling_params=types.SamplingParams(max_tokens=16)).result()

The server must host sessions (``sessions.enabled``): a training client is a LoRA session,
and a sampler snapshot is the server's SaveWeightsForSampler: the adapter frozen as it was
saved, which samples the same while the training session trains on. Differences that
remain (client/python/README.md): one base model per server (``base_model`` is recorded, not
loaded), the targets are the input shifted by one, and the ``*_async`` forms are coroutines
that return the result.
"""
from __future__ import annotations

import concurrent.futures
import os
import types as _pytypes
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar

import grpc

from .client import ServiceClient as _ServiceClient
from .data import datum as _datum
from .errors import StreambpError, invalid
from .training import TrainingClient as _TrainingClient
from .types import AdamParams, ForwardBackwardResult, SampleResult

__all__ = ["ServiceClient", "TrainingClient", "SamplingClient", "types"]

T = TypeVar("T")
U = TypeVar("U")


# -- types ------------------------------------------------------------------------------------
@dataclass
class ModelInput:
    """The tokens the model reads."""
    tokens: List[int]

    @classmethod
    def from_ints(cls, tokens: Sequence[int]) -> "ModelInput":
        return cls(tokens=[int(t) for t in tokens])

    def to_ints(self) -> List[int]:
        return list(self.tokens)

    @property
    def length(self) -> int:
        return len(self.tokens)


@dataclass
class TensorData:
    """A tensor as a flat list with its dtype ("int64" or "float32"/"float64") and shape."""
    data: List[Any]
    dtype: str = "float32"
    shape: Optional[List[int]] = None

    @classmethod
    def from_numpy(cls, array: Any) -> "TensorData":
        return cls(data=array.reshape(-1).tolist(), dtype="int64" if array.dtype.kind in "iu" else "float64",
                   shape=list(array.shape))

    @classmethod
    def from_torch(cls, tensor: Any) -> "TensorData":
        t = tensor.detach().cpu()
        return cls(data=t.reshape(-1).tolist(), dtype="float64" if t.dtype.is_floating_point else "int64",
                   shape=list(t.shape))

    def tolist(self) -> List[Any]:
        return list(self.data)


@dataclass
class Datum:
    """One example: the model input and the loss's per-token inputs by name (lists, numpy
    arrays, torch tensors or TensorData; one value per input token)."""
    model_input: ModelInput
    loss_fn_inputs: Dict[str, Any] = field(default_factory=dict)


@dataclass
class SamplingParams:
    """max_tokens, temperature (0 = greedy), top_p, seed, and stop token ids."""
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: Optional[int] = None
    stop: Sequence[int] = ()


@dataclass
class SampledSequence:
    tokens: List[int]
    logprobs: List[float]
    stop_reason: str


@dataclass
class SampleResponse:
    sequences: List[SampledSequence]
    #: include_prompt_logprobs: log p of each prompt token (None for the first)
    prompt_logprobs: Optional[List[Optional[float]]] = None
    #: topk_prompt_logprobs = k: per prompt position, the k most likely tokens as (id, log-prob)
    topk_prompt_logprobs: Optional[List[Optional[List[Tuple[int, float]]]]] = None


@dataclass
class ForwardBackwardOutput:
    """The step's metrics ("loss:sum", "targets:sum" and the loss's own, e.g. clip_fraction) and
    one {"logprobs": TensorData} per datum (the log-probs of its target_tokens)."""
    metrics: Dict[str, float]
    loss_fn_outputs: List[Dict[str, TensorData]]


@dataclass
class OptimStepResponse:
    metrics: Dict[str, float]


@dataclass
class SaveWeightsForSamplerResponse:
    path: str


#: ``from streambp.tinker import types`` as Tinker's ``from tinker import types``.
types = _pytypes.SimpleNamespace(
    ModelInput=ModelInput, TensorData=TensorData, Datum=Datum, AdamParams=AdamParams, SamplingParams=SamplingParams,
    SampledSequence=SampledSequence, SampleResponse=SampleResponse, ForwardBackwardOutput=ForwardBackwardOutput,
    OptimStepResponse=OptimStepResponse, SaveWeightsForSamplerResponse=SaveWeightsForSamplerResponse)


# -- conversions --------------------------------------------------------------------------------
def _then(future: "concurrent.futures.Future[T]", fn: Callable[[T], U]) -> "concurrent.futures.Future[U]":
    """A future of fn(result), failing as ``future`` fails."""
    out: "concurrent.futures.Future[U]" = concurrent.futures.Future()

    def done(f: "concurrent.futures.Future[T]") -> None:
        try:
            out.set_result(fn(f.result()))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's future
            out.set_exception(e)

    future.add_done_callback(done)
    return out


def _both(first: "concurrent.futures.Future[T]", second: "concurrent.futures.Future[U]"
          ) -> "concurrent.futures.Future[tuple[T, U]]":
    """A future of both results (no thread waits: each completion hands on to the next)."""
    out: "concurrent.futures.Future[tuple[T, U]]" = concurrent.futures.Future()

    def first_done(f: "concurrent.futures.Future[T]") -> None:
        def second_done(g: "concurrent.futures.Future[U]") -> None:
            try:
                out.set_result((f.result(), g.result()))
            except BaseException as e:  # noqa: BLE001 - handed to the caller's future
                out.set_exception(e)
        second.add_done_callback(second_done)

    first.add_done_callback(first_done)
    return out


def _input(values: Any) -> Any:
    if isinstance(values, TensorData):
        return values.data if not values.shape or len(values.shape) <= 1 else _nest(values.data, values.shape)
    return values


def _nest(flat: List[Any], shape: List[int]) -> List[Any]:
    if len(shape) == 1:
        return list(flat)
    step = len(flat) // shape[0] if shape[0] else 0
    return [_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def _to_wire(data: Sequence[Any]) -> List[Any]:
    out = []
    for i, d in enumerate(data):
        if not isinstance(d, Datum):
            raise invalid(f"data[{i}]: expected a tinker.types.Datum, got {type(d).__name__}")
        tokens = d.model_input.tokens if isinstance(d.model_input, ModelInput) else list(d.model_input)
        out.append(_datum(tokens, {k: _input(v) for k, v in d.loss_fn_inputs.items()}))
    return out


def _metrics(result: ForwardBackwardResult, wire: Sequence[Any]) -> ForwardBackwardOutput:
    stats = result.stats
    metrics = {"loss:sum": stats.loss, "targets:sum": float(stats.targets)}
    metrics.update(stats.metrics)
    outputs = []
    for d, lp in zip(wire, result.logprobs):
        # 2-D target_tokens [N, K] (top-k, distillation): the candidates' log-probs, [N, K] too.
        shape = list(d.loss_fn_inputs["target_tokens"].shape) if "target_tokens" in d.loss_fn_inputs else []
        outputs.append({"logprobs": TensorData(data=lp, dtype="float64",
                                               shape=shape if len(shape) == 2 else [len(lp)])})
    return ForwardBackwardOutput(metrics=metrics, loss_fn_outputs=outputs)


# -- clients --------------------------------------------------------------------------------------
class SamplingClient:
    """Samples from a sampler snapshot of a session (save_weights_for_sampler) or, made from a
    training client directly, its current weights."""

    def __init__(self, training: _TrainingClient, snapshot: str = ""):
        self._tc = training
        self.snapshot = snapshot

    @property
    def session(self) -> str:
        return self._tc.session

    def sample(self, prompt: ModelInput, num_samples: int = 1, sampling_params: Optional[SamplingParams] = None,
               include_prompt_logprobs: bool = False,
               topk_prompt_logprobs: int = 0) -> "concurrent.futures.Future[SampleResponse]":
        p = sampling_params or SamplingParams()
        future = self._tc.sample_future([prompt.to_ints()], n=num_samples, max_tokens=p.max_tokens,
                                        temperature=p.temperature, top_p=p.top_p, seed=p.seed,
                                        stop_tokens=list(p.stop), snapshot=self.snapshot)
        scored = self._tc.compute_logprobs_future([prompt.to_ints()], fp64=True, top_k=topk_prompt_logprobs,
                                                  snapshot=self.snapshot) \
            if include_prompt_logprobs or topk_prompt_logprobs > 0 else None

        def convert(r: SampleResult) -> SampleResponse:
            return SampleResponse(sequences=[SampledSequence(tokens=list(c.tokens), logprobs=list(c.logprobs),
                                                             stop_reason=c.finish_reason) for c in r.completions])
        if scored is None:
            return _then(future, convert)

        def with_prompt(pair: "tuple[SampleResult, Any]") -> SampleResponse:
            out, lp = convert(pair[0]), pair[1]
            if include_prompt_logprobs:
                prompt: List[Optional[float]] = [None]
                out.prompt_logprobs = prompt + list(lp.logprobs[0])
            if topk_prompt_logprobs > 0:
                top: List[Optional[List[Tuple[int, float]]]] = [None]
                out.topk_prompt_logprobs = top + [list(pairs) for pairs in lp.top[0]]
            return out
        return _then(_both(future, scored), with_prompt)

    async def sample_async(self, prompt: ModelInput, num_samples: int = 1,
                           sampling_params: Optional[SamplingParams] = None) -> SampleResponse:
        return await _awaitable(self.sample(prompt, num_samples, sampling_params))

    def compute_logprobs(self, prompt: ModelInput) -> "concurrent.futures.Future[List[Optional[float]]]":
        """log p of each prompt token given the ones before it (None for the first), as Tinker's."""
        future = self._tc.compute_logprobs_future([prompt.to_ints()], fp64=True, snapshot=self.snapshot)
        return _then(future, lambda r: [None] + list(r.logprobs[0]))


async def _awaitable(future: "concurrent.futures.Future[T]") -> T:
    import asyncio
    return await asyncio.wrap_future(future)


class TrainingClient:
    """A LoRA session: forward_backward / forward / optim_step return futures applied in the
    order they were submitted (the server's queue stays busy meanwhile). forward_backward
    returns each datum's log-probs (loss_fn_outputs) as Tinker's does, at the cost of one more
    forward pass on the server; set ``return_logprobs = False`` to skip them."""

    def __init__(self, service: "ServiceClient", training: _TrainingClient, base_model: str):
        self._service = service
        self._tc = training
        self.base_model = base_model
        self.return_logprobs = True

    @property
    def session(self) -> str:
        return self._tc.session

    def forward_backward(self, data: Sequence[Datum], loss_fn: str,
                         loss_fn_config: Optional[Mapping[str, Any]] = None
                         ) -> "concurrent.futures.Future[ForwardBackwardOutput]":
        wire = _to_wire(data)
        return _then(self._tc.forward_backward_future(wire, loss_fn, loss_fn_config=loss_fn_config,
                                                      return_logprobs=self.return_logprobs),
                     lambda r: _metrics(r, wire))

    async def forward_backward_async(self, data: Sequence[Datum], loss_fn: str,
                                     loss_fn_config: Optional[Mapping[str, Any]] = None) -> ForwardBackwardOutput:
        return await _awaitable(self.forward_backward(data, loss_fn, loss_fn_config))

    def forward(self, data: Sequence[Datum], loss_fn: str = "cross_entropy",
                loss_fn_config: Optional[Mapping[str, Any]] = None
                ) -> "concurrent.futures.Future[ForwardBackwardOutput]":
        """No gradient: each datum's log-probs of its targets ({"logprobs": TensorData}); for
        cross_entropy also loss:sum = -sum weights * logprobs."""
        wire = _to_wire(data)
        for i, d in enumerate(wire):
            if "target_tokens" in d.loss_fn_inputs and len(d.loss_fn_inputs["target_tokens"].shape) > 1:
                raise invalid(f"data[{i}]: forward takes 1-D target_tokens; for 2-D (top-k) targets "
                              "forward_backward returns the candidates' log-probs (loss_fn_outputs)")
            if d.model_input.HasField("text"):
                raise invalid(f"data[{i}].model_input: forward takes token ids; text goes through tokenize first")
            if "target_tokens" not in d.loss_fn_inputs:
                raise invalid(f"data[{i}].loss_fn_inputs[target_tokens] is missing")
        sequences = [list(d.model_input.tokens) + [d.loss_fn_inputs["target_tokens"].int_data[-1]] for d in wire]

        def weights(d: Any) -> List[float]:
            """cross_entropy's weights (left out: 1), 0 where model_input.loss_mask leaves a target out."""
            n = len(d.model_input.tokens)
            w = list(d.loss_fn_inputs["weights"].float_data) if "weights" in d.loss_fn_inputs else [1.0] * n
            mask = list(d.model_input.loss_mask) or [1] * n
            return [x if m else 0.0 for x, m in zip(w, mask)]

        def convert(r: Any) -> ForwardBackwardOutput:
            outputs = [{"logprobs": TensorData(data=list(lp), dtype="float64", shape=[len(lp)])} for lp in r.logprobs]
            metrics: Dict[str, float] = {}
            if loss_fn == "cross_entropy":
                metrics["loss:sum"] = -sum(w * x for d, lp in zip(wire, r.logprobs) for w, x in zip(weights(d), lp))
            return ForwardBackwardOutput(metrics=metrics, loss_fn_outputs=outputs)
        return _then(self._tc.compute_logprobs_future(sequences, fp64=True), convert)

    def optim_step(self, adam_params: Optional[AdamParams] = None) -> "concurrent.futures.Future[OptimStepResponse]":
        future = self._tc.optim_step_future(adam_params or AdamParams())
        return _then(future, lambda r: OptimStepResponse(metrics={
            "grad_norm": r.grad_norm, "learning_rate": r.learning_rate, "step": float(r.step),
            "policy_version": float(r.policy_version)}))

    async def optim_step_async(self, adam_params: Optional[AdamParams] = None) -> OptimStepResponse:
        return await _awaitable(self.optim_step(adam_params))

    def save_state(self, name: str) -> "concurrent.futures.Future[Any]":
        """The resumable state (adapter, optimizer, step) in the server's checkpoint directory."""
        return _then(self._tc.save_state_future(name), lambda r: _pytypes.SimpleNamespace(path=f"streambp://{self.session}/{r.name}"))

    def load_state(self, path: str) -> "concurrent.futures.Future[Any]":
        return self._tc.load_state_future(path.rsplit("/", 1)[-1])

    def save_weights_for_sampler(self, name: str, ttl_seconds: float = 0.0, replace_oldest: bool = False
                                 ) -> "concurrent.futures.Future[SaveWeightsForSamplerResponse]":
        """Freezes the adapter as it is now into the server's sampler snapshot ``name``
        (SaveWeightsForSampler, applied in order after the steps submitted before it), which
        samples the same while this session trains on; path streambp://<session>/sampler_weights/<name>.
        The server bounds a session's snapshots (sessions.max_snapshots): RESOURCE_EXHAUSTED at
        the bound, or with ``replace_oldest`` the oldest make room."""
        future = self._tc.save_weights_for_sampler_future(name, ttl_seconds=ttl_seconds, replace_oldest=replace_oldest)
        return _then(future, lambda r: SaveWeightsForSamplerResponse(
            path=f"streambp://{self.session}/sampler_weights/{r.name}"))

    def save_weights_and_get_sampling_client(self, name: str) -> SamplingClient:
        """A sampler on a new snapshot, as Tinker's ephemeral sampler weights: a rolling window
        (at the session's bound the oldest snapshots make room, also ones saved by
        save_weights_for_sampler), and a name used again replaces its snapshot, so a loop that
        saves every step runs for ever."""
        try:
            path = self.save_weights_for_sampler(name, replace_oldest=True).result().path
        except StreambpError as e:
            if e.code != grpc.StatusCode.ALREADY_EXISTS:
                raise
            self._tc.delete_snapshot(name)
            path = self.save_weights_for_sampler(name, replace_oldest=True).result().path
        return self._service.create_sampling_client(model_path=path)

    def create_sampling_client(self) -> SamplingClient:
        """Samples from this session's current weights (they move as it trains)."""
        return SamplingClient(self._tc)

    def get_info(self) -> Any:
        return self._tc.info()


class ServiceClient:
    """A connection to a streambp-server hosting sessions (base_url "host:port", with or without
    "http://"); ``api_key`` is its bearer token."""

    def __init__(self, base_url: Optional[str] = None, api_key: Optional[str] = None, **options: Any):
        target = base_url or os.environ.get("STREAMBP_SERVER", "127.0.0.1:50051")
        for scheme in ("http://", "https://", "grpc://"):
            if target.startswith(scheme):
                target = target[len(scheme):]
        if api_key is not None:
            options["token"] = api_key
        self._service = _ServiceClient(target.rstrip("/"), **options)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="streambp-tinker")

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self._service.close()

    def __enter__(self) -> "ServiceClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def create_lora_training_client(self, base_model: str = "", rank: int = 32, seed: Optional[int] = None,
                                    name: Optional[str] = None, **lora: Any) -> TrainingClient:
        """A new LoRA session of rank ``rank`` on the server's model (``base_model`` is recorded;
        a server serves one model)."""
        config: Dict[str, Any] = {"r": rank, **lora}
        if seed is not None:
            config["seed"] = seed
        session = name or f"tinker-{uuid.uuid4().hex[:12]}"
        return TrainingClient(self, self._service.create_training_client(session, lora=config), base_model)

    def create_training_client_from_state(self, path: str) -> TrainingClient:
        """A training client on the session a ``save_state`` path names, restored to that state
        (checkpoints belong to their session: this rewinds it rather than copying it)."""
        session, _, checkpoint = path[len("streambp://"):].partition("/") if path.startswith("streambp://") \
            else ("", "", path)
        if not session:
            raise invalid(f"{path!r}: expected streambp://<session>/<checkpoint> (TrainingClient.save_state's path)")
        tc = self._service.training_client(session)
        tc.load_state(checkpoint)
        return TrainingClient(self, tc, "")

    def create_sampling_client(self, model_path: Optional[str] = None, base_model: Optional[str] = None) -> SamplingClient:
        """A sampler on a snapshot (save_weights_for_sampler's path) or, with ``base_model``, the
        base model (the default session of a server without sessions)."""
        if model_path:
            rest = model_path[len("streambp://"):] if model_path.startswith("streambp://") else ""
            session, kind, snapshot = (rest.split("/", 2) + ["", ""])[:3]
            if not session or kind != "sampler_weights" or not snapshot or "/" in snapshot:
                raise invalid(f"model_path {model_path!r}: expected streambp://<session>/sampler_weights/<name> "
                              "(save_weights_for_sampler's path)")
            return SamplingClient(self._service.training_client(session), snapshot)
        return SamplingClient(self._service.training_client(""))

    def get_server_capabilities(self) -> Any:
        """The server's model and its loss functions (ServerInfo.objectives)."""
        return self._service.info()
