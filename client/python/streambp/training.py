"""TrainingClient: the calls of one session (steps, log-probs, sampling, state, weights, the
RL loop), sent in the order they are submitted."""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import os
import threading
from typing import (TYPE_CHECKING, Any, AsyncIterator, Deque, Iterable, List, Mapping, Optional,
                    Sequence, Union)

import grpc
import grpc.aio
from google.protobuf.message import Message

from ._connection import ProgressCallback, StreamIterator, new_request_id, stream_async
from ._runtime import Sequencer, call_forms
from .custom_loss import LossFn, run_loss
from .data import (Messages, TextLike, batch_kind, data_batch, engine_options, loss_fn_config, objective_options,
                   set_adam_params, sft_batch, text_input, text_inputs, weighted_batch)
from ._weights_folder import FolderWriter
from .errors import StreambpError, invalid
from .history import HistoryMixin
from .types import (AdamParams, CheckpointInfo, CustomLossResult, ExportedWeights, ForwardBackwardResult, LoadedCheckpoint,
                    LogprobsResult, MemoryEstimate, OptimStepResult, PolicyUpdate, RolloutAck, RolloutStats,
                    SampleResult, ServerInfo, SnapshotInfo, SnapshotList, StepStats, TokenizedText, TrainStepResult,
                    from_proto)
from .v1 import trainer_pb2 as pb

if TYPE_CHECKING:
    from .client import ServiceClient

__all__ = ["TrainingClient", "RolloutStream"]

#: A batch: a Batch message, Datum messages (a data batch: the objective names the loss), or
#: token lists (one SFT example each, loss on every token).
BatchLike = Union[pb.Batch, Sequence[pb.Datum], Sequence[Sequence[int]]]
#: Objective options: SftOptions / DpoOptions / GrpoOptions / WeightedOptions, or a dict of their fields.
OptionsLike = Union[Message, Mapping[str, Any], None]
#: Engine options: EngineOptions or a dict ({"engine": "stream", "chunk": 256}).
EngineLike = Union[pb.EngineOptions, Mapping[str, Any], None]

def _as_batch(batch: BatchLike) -> pb.Batch:
    if isinstance(batch, pb.Batch):
        return batch
    if len(batch) > 0 and isinstance(batch[0], pb.Datum):
        return data_batch(batch)
    return sft_batch(batch)


def _step_request(request: Any, batch: BatchLike, objective: str, options: OptionsLike, engine: EngineLike,
                  request_id: Optional[str], session: str,
                  config: Optional[Mapping[str, Any]] = None) -> Any:
    """Fills a ForwardBackwardRequest / TrainStepRequest."""
    batch = _as_batch(batch)
    request.request_id = request_id or new_request_id()
    request.session = session
    # "" = the batch kind's objective; a weighted batch's is named weighted_logprobs.
    request.objective = objective or ("weighted_logprobs" if batch_kind(batch) == "weighted" else "")
    request.batch.CopyFrom(batch)
    # A data batch's options are the loss's config by name (Tinker's loss_fn_config).
    if options is not None and batch_kind(batch) == "data" and not isinstance(options, Message):
        config, options = {**options, **(config or {})}, None
    if config:
        for key, value in loss_fn_config(config).items():
            request.loss_fn_config[key].CopyFrom(value)
    if options is not None:
        kind = batch_kind(batch)
        if not kind:
            raise invalid("the batch is empty: set batch.sft, batch.dpo, batch.grpo or batch.weighted")
        message = objective_options(kind, options) if not isinstance(options, Message) else options
        field = {pb.SftOptions: "sft", pb.DpoOptions: "dpo", pb.GrpoOptions: "grpo",
                 pb.WeightedOptions: "weighted"}.get(type(message))
        if field is None:
            raise invalid(f"options: expected SftOptions, DpoOptions, GrpoOptions, WeightedOptions or a dict, got "
                          f"{type(options).__name__}")
        getattr(request, field).CopyFrom(message)
    if engine is not None:
        request.engine.CopyFrom(engine_options(engine))
    return request


def _sequences(sequences: Sequence[Sequence[int]]) -> List[pb.TokenSequence]:
    return [pb.TokenSequence(tokens=list(s)) for s in sequences]


class TrainingClient(HistoryMixin):
    """The calls of one session ("" = the default session: the whole model on a server
    without sessions). Get one from ServiceClient.training_client() or
    create_training_client(). Thread-safe.

    Every call has three forms: ``name(...)`` blocks, ``name_future(...)`` returns a
    ``concurrent.futures.Future``, ``name_async(...)`` is a coroutine. The calls that depend
    on or change the session's state (forward_backward, forward_backward_custom, optim_step,
    train_step, compute_logprobs, sample, save_state, load_state, save_weights,
    export_adapter, push_rollouts) are sent in the order they were submitted, one after the
    other reaching the server's queue, so futures are applied in submission order while the
    server stays busy. Reads (info, rollout_stats, history, estimate_memory, tokenize, detokenize)
    and streams (watch_policy, open_rollout_stream) are not ordered. Each TrainingClient has
    its own order: share one client between threads that must be ordered together.

    Steps go as ForwardBackwardProgress / TrainStepProgress, whose first message says the
    server has queued the step, so the next call can be sent at once (``pipeline``, the
    default); with ``pipeline=False`` they go as the unary ForwardBackward / TrainStep, one
    at a time on the wire, without progress.

    Mutating calls carry a request id (``request_id=``, random by default, the same across
    the channel's retries of UNAVAILABLE), so a retried step is applied once."""

    def __init__(self, service: "ServiceClient", session: str = "", pipeline: bool = True):
        self._service = service
        self._conn = service._conn
        self._runtime = self._conn.runtime
        self._sequencer = Sequencer()
        self.session = session
        self.pipeline = pipeline

    def __repr__(self) -> str:
        return f"TrainingClient(target={self._conn.target!r}, session={self.session!r}, pipeline={self.pipeline})"

    @property
    def service(self) -> "ServiceClient":
        """The ServiceClient this client belongs to."""
        return self._service

    # -- info -----------------------------------------------------------------------------
    async def _info(self, *, timeout: Optional[float] = None) -> ServerInfo:
        """GetInfo for this session (ServerInfo.session is set on a server with sessions)."""
        response = await self._conn.unary("GetInfo", pb.GetInfoRequest(session=self.session),
                                          timeout or self._conn.info_timeout)
        return from_proto(ServerInfo, response)

    info, info_future, info_async = call_forms(_info)

    # -- steps ----------------------------------------------------------------------------
    async def _forward_backward(self, batch: BatchLike, objective: str = "", options: OptionsLike = None, *,
                                engine: EngineLike = None, on_progress: Optional[ProgressCallback] = None,
                                loss_fn_config: Optional[Mapping[str, Any]] = None, return_logprobs: bool = False,
                                request_id: Optional[str] = None,
                                timeout: Optional[float] = None) -> ForwardBackwardResult:
        """ForwardBackward: forward and backward of ``batch``; the gradients accumulate until
        optim_step. ``objective`` "" = the batch kind (sft, dpo, grpo, weighted_logprobs for a
        weighted batch) or a registered objective name; ``options`` the objective's options
        (message or dict, e.g. {"beta": 0.1} for DPO); ``engine`` engine and chunk sizes;
        ``on_progress(StepProgress)`` sees queued / started / layer-by-layer events (called on
        the SDK's I/O thread: keep it short). ``batch`` may be Datum messages (``datum()``): a data
        batch for the loss ``objective`` names (cross_entropy, ppo, ...), whose options go by name
        in ``loss_fn_config`` (or ``options`` as a dict), e.g. {"clip_low_threshold": 0.9}.
        ``return_logprobs``: also each sequence's per-token log-probs at the weights the
        gradients were computed on (``.logprobs``, in the batch's order; a datum's N values are
        the log-probs of its target_tokens): one more forward pass. Mutating (request id)."""
        request = _step_request(pb.ForwardBackwardRequest(), batch, objective, options, engine, request_id,
                                self.session, loss_fn_config)
        request.return_logprobs = return_logprobs
        response = await self._conn.step("ForwardBackward", request, timeout, on_progress, self.pipeline)
        return _forward_backward_result(response)

    forward_backward, forward_backward_future, forward_backward_async = call_forms(_forward_backward, ordered=True)

    async def _forward_backward_custom(self, sequences: Sequence[Sequence[int]], loss_fn: LossFn, *,
                                       mode: str = "auto", temperature: Optional[float] = None,
                                       engine: EngineLike = None, on_progress: Optional[ProgressCallback] = None,
                                       request_id: Optional[str] = None,
                                       timeout: Optional[float] = None) -> CustomLossResult:
        """A forward/backward with a loss computed here, exactly: ComputeLogprobs (float64) of
        ``sequences`` at the current policy, ``loss_fn(sequences, logprobs)`` with its gradient
        dL/dlogprobs (see streambp.custom_loss: mode "torch" differentiates a PyTorch loss,
        mode "gradients" takes the gradients loss_fn returns, "auto" picks torch when
        installed), then ForwardBackward of a weighted_logprobs batch with those weights and
        the policy version they were computed at, so the server's gradient is the gradient of
        the client's loss (one extra forward pass). If the policy moved in between, the server
        refuses with FAILED_PRECONDITION. ``temperature`` applies to both passes. loss_fn runs
        on a worker thread. Mutating (request id of the ForwardBackward)."""
        seqs = [list(s) for s in sequences]
        if not seqs:
            raise invalid("forward_backward_custom: no sequences")
        for i, s in enumerate(seqs):
            if len(s) < 2:
                raise invalid(f"forward_backward_custom: sequences[{i}] needs at least 2 tokens")
        logprobs = await self._logprobs(seqs, False, temperature, True, timeout)
        loop = asyncio.get_running_loop()
        loss, grads, metrics = await loop.run_in_executor(None, run_loss, loss_fn, seqs, logprobs.logprobs, mode)
        request = _step_request(pb.ForwardBackwardRequest(), weighted_batch(seqs, grads, logprobs.policy_version),
                                "weighted_logprobs", None, engine, request_id, self.session)
        if temperature is not None:
            request.weighted.temperature = temperature
        response = await self._conn.step("ForwardBackward", request, timeout, on_progress, self.pipeline)
        return CustomLossResult(loss=loss, metrics=metrics, logprobs=logprobs.logprobs, weights=grads,
                                policy_version=logprobs.policy_version,
                                forward_backward=_forward_backward_result(response))

    forward_backward_custom, forward_backward_custom_future, forward_backward_custom_async = call_forms(
        _forward_backward_custom, ordered=True)

    async def _optim_step(self, adam_params: Union[AdamParams, Mapping[str, float], None] = None, *,
                          request_id: Optional[str] = None, timeout: Optional[float] = None) -> OptimStepResult:
        """OptimStep: applies the accumulated gradients (the session's optimizer, clipping and
        LR schedule, or ``adam_params`` for this step: an AdamParams, or a dict of some of its
        fields, the others taking Tinker's defaults); the policy version then increases by one.
        A non-finite gradient skips the step (OptimStepResult.skipped). Mutating (request id)."""
        request = pb.OptimStepRequest(request_id=request_id or new_request_id(), session=self.session)
        if adam_params is not None:
            set_adam_params(request, adam_params)
        response = await self._conn.unary("OptimStep", request, timeout, request.request_id)
        return from_proto(OptimStepResult, response)

    optim_step, optim_step_future, optim_step_async = call_forms(_optim_step, ordered=True)

    async def _train_step(self, batch: BatchLike, objective: str = "", options: OptionsLike = None, *,
                          engine: EngineLike = None, on_progress: Optional[ProgressCallback] = None,
                          adam_params: Union[AdamParams, Mapping[str, float], None] = None,
                          loss_fn_config: Optional[Mapping[str, Any]] = None,
                          request_id: Optional[str] = None, timeout: Optional[float] = None) -> TrainStepResult:
        """TrainStep: forward_backward + optim_step in one call, the usual path (arguments as in
        forward_backward and optim_step; on_progress also sees "optimizer"). Mutating (request id)."""
        request = _step_request(pb.TrainStepRequest(), batch, objective, options, engine, request_id, self.session,
                                loss_fn_config)
        if adam_params is not None:
            set_adam_params(request, adam_params)
        response = await self._conn.step("TrainStep", request, timeout, on_progress, self.pipeline)
        return from_proto(TrainStepResult, response)

    train_step, train_step_future, train_step_async = call_forms(_train_step, ordered=True)

    # -- log-probs and sampling -----------------------------------------------------------
    async def _logprobs(self, sequences: Sequence[Sequence[int]], reference: bool, temperature: Optional[float],
                        fp64: bool, timeout: Optional[float], top_k: int = 0, snapshot: str = "") -> LogprobsResult:
        request = pb.ComputeLogprobsRequest(sequences=_sequences(sequences), reference=reference,
                                            session=self.session, fp64=fp64, top_k=top_k, snapshot=snapshot)
        if temperature is not None:
            request.temperature = temperature
        response = await self._conn.unary("ComputeLogprobs", request, timeout)
        top = []
        if top_k > 0:
            for s in response.sequences:
                pairs = list(zip(s.top_ids, s.top_logprobs))
                top.append([pairs[i:i + top_k] for i in range(0, len(pairs), top_k)])
        return LogprobsResult(logprobs=[list(s.logprobs_fp64 if fp64 else s.logprobs) for s in response.sequences],
                              policy_version=response.policy_version, top=top)

    async def _compute_logprobs(self, sequences: Sequence[Sequence[int]], *, reference: bool = False,
                                temperature: Optional[float] = None, fp64: bool = False, top_k: int = 0,
                                snapshot: str = "", timeout: Optional[float] = None) -> LogprobsResult:
        """ComputeLogprobs: logprobs[s][i] = log p(sequences[s][i+1] | sequences[s][..i]) under
        the policy (or the frozen reference model with ``reference``), at ``temperature``
        (default 1); ``fp64`` returns them in double precision; ``top_k`` (at most 20) also the
        k most likely next tokens at every position (``LogprobsResult.top``, for distillation);
        ``snapshot``: under a sampler snapshot of the session instead of its current weights."""
        return await self._logprobs(sequences, reference, temperature, fp64, timeout, top_k, snapshot)

    compute_logprobs, compute_logprobs_future, compute_logprobs_async = call_forms(_compute_logprobs, ordered=True)

    async def _sample(self, prompts: Optional[Sequence[Sequence[int]]] = None, *,
                      text: Union[str, Sequence[str], None] = None,
                      messages: Union[Messages, Sequence[Messages], None] = None, n: int = 1, max_tokens: int = 16,
                      temperature: Optional[float] = None, top_p: Optional[float] = None,
                      stop_tokens: Sequence[int] = (), seed: Optional[int] = None, ignore_eos: bool = False,
                      enable_thinking: Optional[bool] = None, return_routed_experts: bool = False,
                      snapshot: str = "", timeout: Optional[float] = None) -> SampleResult:
        """Sample: ``n`` completions of each prompt from the current policy, with the sampler's log-prob
        of each token, the finish reason, the text (when the model has a tokenizer) and the policy
        version. Prompts are exactly one of ``prompts`` (token lists), ``text`` (a string or a list
        of strings) or ``messages`` (a conversation or a list of conversations, rendered with the
        generation prompt; ``enable_thinking`` for qwen3). ``temperature`` (default 1; 0 = greedy),
        ``top_p``, ``stop_tokens``, ``seed`` (same seed and policy version, same samples); a
        completion also ends at the model's end-of-sequence tokens unless ``ignore_eos``.
        ``return_routed_experts``: each completion carries its tokens' experts (MoE) for replay.
        ``snapshot``: from a sampler snapshot of the session (save_weights_for_sampler), which
        stays as it was saved while the session trains on."""
        if [prompts is not None, text is not None, messages is not None].count(True) != 1:
            raise invalid("sample: give exactly one of prompts=, text= or messages=")
        request = pb.SampleRequest(n=n, max_tokens=max_tokens, stop_tokens=list(stop_tokens), session=self.session,
                                   ignore_eos=ignore_eos, return_routed_experts=return_routed_experts,
                                   snapshot=snapshot)
        if prompts is not None:
            request.prompts.extend(_sequences(prompts))
        else:
            texts = text_inputs(text if text is not None else messages)  # type: ignore[arg-type]
            request.text_prompts.extend(text_input(t, enable_thinking) for t in texts)
        if temperature is not None:
            request.temperature = temperature
        if top_p is not None:
            request.top_p = top_p
        if seed is not None:
            request.seed = seed
        response = await self._conn.unary("Sample", request, timeout)
        return from_proto(SampleResult, response)

    sample, sample_future, sample_async = call_forms(_sample, ordered=True)

    # -- text (delegated to the server; not ordered) ----------------------------------------
    async def _tokenize(self, inputs: Union[TextLike, Sequence[TextLike]], *, add_special_tokens: bool = False,
                        add_generation_prompt: bool = False, enable_thinking: Optional[bool] = None,
                        timeout: Optional[float] = None) -> List[TokenizedText]:
        """Tokenize (see ServiceClient.tokenize)."""
        return await self._service._tokenize(inputs, add_special_tokens=add_special_tokens,
                                             add_generation_prompt=add_generation_prompt,
                                             enable_thinking=enable_thinking, timeout=timeout)

    tokenize, tokenize_future, tokenize_async = call_forms(_tokenize)

    async def _detokenize(self, sequences: Sequence[Sequence[int]], *, skip_special_tokens: bool = False,
                          timeout: Optional[float] = None) -> List[str]:
        """Detokenize (see ServiceClient.detokenize)."""
        return await self._service._detokenize(sequences, skip_special_tokens=skip_special_tokens, timeout=timeout)

    detokenize, detokenize_future, detokenize_async = call_forms(_detokenize)

    # -- state ----------------------------------------------------------------------------
    async def _save_state(self, name: str = "", *, request_id: Optional[str] = None,
                          timeout: Optional[float] = None) -> CheckpointInfo:
        """SaveCheckpoint: the full resumable state (weights, optimizer, step, schedule, RNG,
        version) under ``name`` in the server's checkpoint directory ("" = "step-<step>").
        Mutating (request id)."""
        request = pb.SaveCheckpointRequest(request_id=request_id or new_request_id(), name=name, session=self.session)
        response = await self._conn.unary("SaveCheckpoint", request, timeout, request.request_id)
        return from_proto(CheckpointInfo, response)

    save_state, save_state_future, save_state_async = call_forms(_save_state, ordered=True)

    async def _load_state(self, name: str = "", *, request_id: Optional[str] = None,
                          timeout: Optional[float] = None) -> LoadedCheckpoint:
        """LoadCheckpoint: restores the state saved under ``name`` ("" = the newest complete
        checkpoint). Mutating (request id)."""
        request = pb.LoadCheckpointRequest(request_id=request_id or new_request_id(), name=name,
                                           session=self.session)
        response = await self._conn.unary("LoadCheckpoint", request, timeout, request.request_id)
        return from_proto(LoadedCheckpoint, response)

    load_state, load_state_future, load_state_async = call_forms(_load_state, ordered=True)

    async def _save_weights(self, path: Union[str, "os.PathLike[str]"], *, merged: bool = False,
                            with_files: bool = True, version: int = 0, max_chunk_bytes: int = 0,
                            snapshot: str = "", timeout: Optional[float] = None) -> ExportedWeights:
        """ExportWeights into the folder ``path`` (created if needed), as Hugging Face / PEFT
        load it: model.safetensors + config.json for a whole model, adapter_model.safetensors +
        adapter_config.json for a LoRA session (``merged=True``: the base with the adapter
        folded in, as a whole model), and with ``with_files`` the model folder's tokenizer and
        generation files. Each file is checked (contiguous pieces, size, SHA-256) and renamed
        into place only once complete. ``version``: the policy version wanted (0 = current;
        ExportedWeights.note says when another was served); ``snapshot``: a sampler snapshot's
        weights instead of the current ones."""
        return await self._export(path, "", merged, with_files, version, max_chunk_bytes, timeout, snapshot)

    save_weights, save_weights_future, save_weights_async = call_forms(_save_weights, ordered=True)

    async def _export_adapter(self, path: Union[str, "os.PathLike[str]"], *, with_files: bool = False,
                              snapshot: str = "", timeout: Optional[float] = None) -> ExportedWeights:
        """The session's LoRA adapter (or that of its sampler snapshot ``snapshot``) as a PEFT
        folder (adapter_model.safetensors + adapter_config.json), as vLLM and SGLang load it;
        FAILED_PRECONDITION, with nothing written, when the session is not an adapter."""
        return await self._export(path, "peft_adapter", False, with_files, 0, 0, timeout, snapshot)

    export_adapter, export_adapter_future, export_adapter_async = call_forms(_export_adapter, ordered=True)

    async def _export(self, path: Union[str, "os.PathLike[str]"], expect_format: str, merged: bool, with_files: bool,
                      version: int, max_chunk_bytes: int, timeout: Optional[float], snapshot: str = "") -> ExportedWeights:
        request = pb.ExportWeightsRequest(merged=merged, max_chunk_bytes=max_chunk_bytes, version=version,
                                          session=self.session, with_files=with_files, snapshot=snapshot)
        folder = os.fspath(path)
        call = self._conn.stub.ExportWeights(request, **self._conn.call_kwargs(timeout or self._conn.timeout))
        writer = FolderWriter(folder, expect_format, self.session)
        try:
            async for chunk in call:
                writer.add(chunk)
        except grpc.aio.AioRpcError as e:
            writer.abort()
            raise StreambpError.from_rpc_error(e) from None
        except BaseException:
            writer.abort()
            call.cancel()
            raise
        return writer.finish()

    # -- memory ---------------------------------------------------------------------------
    # -- sampler snapshots ----------------------------------------------------------------
    async def _save_weights_for_sampler(self, name: str, *, ttl_seconds: float = 0.0, replace_oldest: bool = False,
                                        request_id: Optional[str] = None,
                                        timeout: Optional[float] = None) -> SnapshotInfo:
        """SaveWeightsForSampler: freezes the session's weights now (a LoRA session's adapter) as
        snapshot ``name``, which sample / compute_logprobs / save_weights / export_adapter take as
        ``snapshot=name`` while the session trains on. ``ttl_seconds``: removed that long after
        (0 = the server's default, sessions.snapshot_ttl_seconds). Bounded per session
        (RESOURCE_EXHAUSTED: delete one first; ``replace_oldest`` removes the oldest to make room
        instead); ALREADY_EXISTS for a taken name. Mutating (request id); applied in order with
        this client's steps."""
        request = pb.SaveWeightsForSamplerRequest(request_id=request_id or new_request_id(), session=self.session,
                                                  name=name, ttl_seconds=ttl_seconds, replace_oldest=replace_oldest)
        response = await self._conn.unary("SaveWeightsForSampler", request, timeout, request.request_id)
        return from_proto(SnapshotInfo, response)

    save_weights_for_sampler, save_weights_for_sampler_future, save_weights_for_sampler_async = call_forms(
        _save_weights_for_sampler, ordered=True)

    async def _list_snapshots(self, *, timeout: Optional[float] = None) -> SnapshotList:
        """ListSnapshots: the session's live sampler snapshots, oldest first, and the bounds."""
        response = await self._conn.unary("ListSnapshots", pb.ListSnapshotsRequest(session=self.session),
                                          timeout or self._conn.info_timeout)
        return from_proto(SnapshotList, response)

    list_snapshots, list_snapshots_future, list_snapshots_async = call_forms(_list_snapshots)

    async def _delete_snapshot(self, name: str, *, request_id: Optional[str] = None,
                               timeout: Optional[float] = None) -> str:
        """DeleteSnapshot: removes sampler snapshot ``name`` (memory and disk); returns its name."""
        request = pb.DeleteSnapshotRequest(request_id=request_id or new_request_id(), session=self.session, name=name)
        response = await self._conn.unary("DeleteSnapshot", request, timeout, request.request_id)
        return str(response.name)

    delete_snapshot, delete_snapshot_future, delete_snapshot_async = call_forms(_delete_snapshot, ordered=True)

    async def _estimate_memory(self, seq_len: int, batch: int = 1, *, engine: EngineLike = None,
                               timeout: Optional[float] = None) -> MemoryEstimate:
        """EstimateMemory: the predicted peak memory of a step of ``batch`` rows of ``seq_len``
        tokens for this session (an adapter: frozen base), and whether it fits the budget."""
        request = pb.EstimateMemoryRequest(seq_len=seq_len, batch=batch, session=self.session)
        if engine is not None:
            request.engine.CopyFrom(engine_options(engine))
        response = await self._conn.unary("EstimateMemory", request, timeout or self._conn.info_timeout)
        return from_proto(MemoryEstimate, response)

    estimate_memory, estimate_memory_future, estimate_memory_async = call_forms(_estimate_memory)

    # -- the RL loop ----------------------------------------------------------------------
    async def _push_rollouts(self, groups: Iterable[pb.RolloutGroup], *,
                             timeout: Optional[float] = None) -> List[RolloutAck]:
        """PushRollouts: GRPO groups (see streambp.rollout_group) for the server's own steps,
        one RolloutAck each (accepted | duplicate | stale | invalid), acknowledged once
        durably queued. A group id is idempotent: a repeated push is a "duplicate"."""
        request = pb.PushRolloutsRequest(groups=list(groups), session=self.session)
        response = await self._conn.unary("PushRollouts", request, timeout)
        return [from_proto(RolloutAck, a) for a in response.acks]

    push_rollouts, push_rollouts_future, push_rollouts_async = call_forms(_push_rollouts, ordered=True)

    async def _rollout_stats(self, *, timeout: Optional[float] = None) -> RolloutStats:
        """GetRolloutStats: the session's rollout queue (depth, accepted, consumed, stale, steps run)."""
        response = await self._conn.unary("GetRolloutStats", pb.GetRolloutStatsRequest(session=self.session),
                                          timeout or self._conn.info_timeout)
        return from_proto(RolloutStats, response)

    rollout_stats, rollout_stats_future, rollout_stats_async = call_forms(_rollout_stats)

    def _watch_call(self, since_version: int, timeout: Optional[float]) -> Any:
        request = pb.WatchPolicyRequest(since_version=since_version, session=self.session)
        return lambda: self._conn.stub.WatchPolicy(request, **self._conn.call_kwargs(timeout))

    def watch_policy(self, since_version: int = 0, *, timeout: Optional[float] = None) -> StreamIterator[PolicyUpdate]:
        """WatchPolicy: a blocking iterator of PolicyUpdate, one per new policy version after
        ``since_version`` (the current one first), until ``timeout`` seconds (None = no
        deadline) or close(). Use it in a ``with`` block or call close() to end the stream."""
        return StreamIterator(self._conn, self._watch_call(since_version, timeout),
                              lambda m: from_proto(PolicyUpdate, m))

    def watch_policy_async(self, since_version: int = 0, *,
                           timeout: Optional[float] = None) -> AsyncIterator[PolicyUpdate]:
        """WatchPolicy as an async iterator (``async for update in tc.watch_policy_async()``)."""
        return stream_async(self._conn, self._watch_call(since_version, timeout),
                            lambda m: from_proto(PolicyUpdate, m))

    def open_rollout_stream(self, *, timeout: Optional[float] = None) -> "RolloutStream":
        """PushRolloutsStream: a stream to push groups one at a time, each push returning a
        Future of its RolloutAck (acks come in order). Close it (or use ``with``) when done."""
        return RolloutStream(self, timeout)


class RolloutStream:
    """An open PushRolloutsStream: ``push(group)`` returns a concurrent.futures.Future of the
    group's RolloutAck; ``close()`` ends the stream and waits for the outstanding acks. If
    the stream fails, every outstanding future fails with the StreambpError."""

    def __init__(self, client: TrainingClient, timeout: Optional[float]):
        self._client = client
        self._loop = client._runtime.loop
        self._lock = threading.Lock()
        self._pending: Deque["concurrent.futures.Future[RolloutAck]"] = collections.deque()
        self._closed = False
        self._error: Optional[StreambpError] = None
        self._outbox: "Optional[asyncio.Queue[Optional[pb.RolloutGroup]]]" = None
        self._ready = threading.Event()
        self._task = client._runtime.submit(self._run(timeout))
        self._ready.wait()

    async def _requests(self) -> AsyncIterator[pb.RolloutGroup]:
        assert self._outbox is not None
        while True:
            group = await self._outbox.get()
            if group is None:
                return
            yield group

    async def _run(self, timeout: Optional[float]) -> None:
        self._outbox = asyncio.Queue()
        self._ready.set()
        conn = self._client._conn
        call = conn.stub.PushRolloutsStream(self._requests(), **conn.call_kwargs(timeout))
        try:
            async for ack in call:
                with self._lock:
                    future = self._pending.popleft() if self._pending else None
                if future is not None:
                    future.set_result(from_proto(RolloutAck, ack))
            self._fail(StreambpError(grpc.StatusCode.INTERNAL, "the rollout stream has ended (groups pushed after "
                                                               "its end are not acknowledged)"))
        except grpc.aio.AioRpcError as e:
            self._fail(StreambpError.from_rpc_error(e))
        except asyncio.CancelledError:
            call.cancel()
            self._fail(StreambpError(grpc.StatusCode.CANCELLED, "the rollout stream was closed"))
            raise

    def _fail(self, error: StreambpError) -> None:
        with self._lock:
            self._error = error
            pending, self._pending = list(self._pending), collections.deque()
        for future in pending:
            if not future.done():
                future.set_exception(error)

    def push(self, group: pb.RolloutGroup) -> "concurrent.futures.Future[RolloutAck]":
        """Sends one group (its session set to this client's when empty); the Future resolves
        to its RolloutAck."""
        if not group.session and self._client.session:
            copy = pb.RolloutGroup()
            copy.CopyFrom(group)
            copy.session = self._client.session
            group = copy
        future: "concurrent.futures.Future[RolloutAck]" = concurrent.futures.Future()
        with self._lock:
            if self._error is not None:
                raise self._error
            if self._closed:
                raise StreambpError(grpc.StatusCode.FAILED_PRECONDITION, "push on a closed rollout stream")
            self._pending.append(future)
            assert self._outbox is not None
            self._loop.call_soon_threadsafe(self._outbox.put_nowait, group)
        return future

    def close(self, timeout: Optional[float] = None) -> None:
        """Ends the stream and waits (up to ``timeout`` seconds) for the outstanding acks."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            assert self._outbox is not None
            self._loop.call_soon_threadsafe(self._outbox.put_nowait, None)
        try:
            self._task.result(timeout)
        except concurrent.futures.TimeoutError:
            self._task.cancel()

    def __enter__(self) -> "RolloutStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _forward_backward_result(response: pb.ForwardBackwardResponse) -> ForwardBackwardResult:
    return ForwardBackwardResult(stats=from_proto(StepStats, response.stats), policy_version=response.policy_version,
                                 logprobs=[list(s.logprobs_fp64) for s in response.logprobs])
