"""Typed results of the SDK's calls: frozen dataclasses mirroring the streambp.v1 messages.

Field names are the proto's (see proto/streambp/v1/trainer.proto for their meaning);
repeated fields are lists, maps dicts, nested messages dataclasses, and proto3
``optional`` fields ``None`` when unset. ``from_proto`` builds one from its message.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Type, TypeVar

from google.protobuf.message import Message

__all__ = [
    "TokenizerInfo", "LoraConfig", "SessionInfo", "ObjectiveInfo", "ServerInfo", "SessionList", "StepStats",
    "ForwardBackwardResult", "OptimStepResult", "TrainStepResult", "StepProgress", "LogprobsResult",
    "Completion", "SampleResult", "TokenizedText", "CheckpointInfo", "LoadedCheckpoint",
    "MemoryEstimate", "PolicyUpdate", "RolloutAck", "RolloutStats", "ExportedWeights",
    "CustomLossResult", "AdamParams", "from_proto",
]

T = TypeVar("T")


def from_proto(cls: Type[T], message: Message) -> T:
    """The dataclass ``cls`` filled from ``message``, field by field, by name."""
    values: Dict[str, Any] = {}
    for name, convert in _converters(cls):
        values[name] = convert(message)
    return cls(**values)


_CONVERTERS: Dict[type, List[typing.Tuple[str, Callable[[Message], Any]]]] = {}


def _converters(cls: type) -> List[typing.Tuple[str, Callable[[Message], Any]]]:
    cached = _CONVERTERS.get(cls)
    if cached is None:
        hints = typing.get_type_hints(cls)
        cached = [(f.name, _converter(f.name, hints[f.name])) for f in dataclasses.fields(cls)]
        _CONVERTERS[cls] = cached
    return cached


def _converter(name: str, hint: Any) -> Callable[[Message], Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union and type(None) in args:  # Optional[X]: None when the field is unset
        inner = _converter(name, next(a for a in args if a is not type(None)))
        return lambda m: inner(m) if m.HasField(name) else None
    if origin in (list, List):
        item = typing.cast(type, args[0])
        if dataclasses.is_dataclass(item):
            return lambda m: [from_proto(item, x) for x in getattr(m, name)]
        return lambda m: list(getattr(m, name))
    if origin in (dict, Dict):
        return lambda m: dict(getattr(m, name))
    if dataclasses.is_dataclass(hint):
        nested = typing.cast(type, hint)
        return lambda m: from_proto(nested, getattr(m, name))
    return lambda m: getattr(m, name)


@dataclass(frozen=True)
class TokenizerInfo:
    """The model folder's tokenizer as the server uses it (``available`` False: none)."""
    available: bool
    type: str
    vocab_size: int
    chat_format: str
    eos_token_ids: List[int]
    bos_token: str
    eos_token: str


@dataclass(frozen=True)
class LoraConfig:
    """A session's LoRA adapter: rank ``r``, ``alpha`` (None = 2 r), target modules, rsLoRA, seed,
    and ``modules_to_save`` (``["gate"]``: the mixture-of-experts router trained as a full copy)."""
    r: int
    alpha: Optional[float]
    target_modules: List[str]
    use_rslora: bool
    seed: int
    modules_to_save: List[str]


@dataclass(frozen=True)
class SessionInfo:
    """A session: kind (lora | full), its adapter, step, policy version, residency and sizes."""
    name: str
    kind: str
    lora: LoraConfig
    step: int
    policy_version: int
    resident: bool
    trainable_parameters: int
    device_bytes: int
    idle_seconds: float
    pending_micro_batches: int
    optimizer: str
    learning_rate: float
    groups_per_step: int
    max_staleness: int


@dataclass(frozen=True)
class SnapshotInfo:
    """A sampler snapshot (save_weights_for_sampler): the session's weights frozen under a name,
    with the step and policy version they had, their bytes on disk, when they were saved and
    when they expire (0 = kept until deleted), and whether they are in device memory now."""
    session: str
    name: str
    step: int
    policy_version: int
    bytes: int
    created_unix: float
    expires_unix: float
    resident: bool


@dataclass(frozen=True)
class SnapshotList:
    """ListSnapshots: a session's live snapshots (oldest first) and the per-session bounds."""
    snapshots: List[SnapshotInfo]
    max_snapshots: int
    max_snapshot_bytes: int


@dataclass(frozen=True)
class ObjectiveInfo:
    """A registered objective (loss function): its typed batch kind, its options (the keys of
    loss_fn_config) and the per-token inputs a Datum gives it besides target_tokens (none: it
    takes no data batch)."""
    name: str
    batch_kind: str
    options: List[str]
    inputs: List[str]
    optional_inputs: List[str]


@dataclass(frozen=True)
class ServerInfo:
    """GetInfo: the model, dtype, device, engine and chunk sizes, policy version, limits."""
    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    num_parameters: int
    dtype: str
    device: str
    engine: str
    chunk: int
    logits_chunk: int
    policy_version: int
    step: int
    world_size: int
    optimizer: str
    learning_rate: float
    max_sequence_length: int
    max_tokens_per_request: int
    reference_model: bool
    server_version: str
    runtime: str
    pending_micro_batches: int
    key_chunk: int
    sessions: bool
    session: Optional[SessionInfo]
    tokenizer: TokenizerInfo
    offload_layer_inputs: bool
    objectives: List[ObjectiveInfo]
    context_parallel: int  # ranks each sequence is split over (1: data parallel, if world_size > 1)


@dataclass(frozen=True)
class SessionList:
    """ListSessions: the sessions the caller may see, and the server's limits."""
    sessions: List[SessionInfo]
    max_sessions: int
    max_resident_sessions: int


@dataclass(frozen=True)
class StepStats:
    """What a ForwardBackward did: loss, the objective's metrics, sizes, engine, memory, time."""
    loss: float
    metrics: Dict[str, float]
    tokens: int
    targets: int
    sequences: int
    micro_batches: int
    engine: str
    chunk: int
    logits_chunk: int
    key_chunk: int
    peak_memory_bytes: int
    seconds: float
    queue_seconds: float
    offloaded_bytes: int


@dataclass(frozen=True)
class ForwardBackwardResult:
    """ForwardBackward: the step's statistics and the policy version the gradients were computed on;
    with ``return_logprobs`` each sequence's per-token log-probs (float64) at those weights."""
    stats: StepStats
    policy_version: int
    logprobs: List[List[float]]

    @property
    def loss(self) -> float:
        """The loss of the batch (stats.loss)."""
        return self.stats.loss


@dataclass(frozen=True)
class OptimStepResult:
    """OptimStep: the new policy version and step, learning rate, gradient norm, whether skipped."""
    policy_version: int
    step: int
    learning_rate: float
    grad_norm: float
    skipped: bool
    skip_reason: str


@dataclass(frozen=True)
class AdamParams:
    """Adam parameters for one ``optim_step``, as Tinker's ``AdamParams`` (and with its
    defaults): this step's learning rate (no schedule applies), betas, eps, decoupled weight
    decay and gradient clipping norm (0 = no clipping) instead of the session's optimizer
    configuration. The session's optimizer must be adamw; its moments carry on."""
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


@dataclass(frozen=True)
class TrainStepResult:
    """TrainStep: the ForwardBackward statistics and the OptimStep result."""
    stats: StepStats
    optim: OptimStepResult

    @property
    def loss(self) -> float:
        """The loss of the batch (stats.loss)."""
        return self.stats.loss

    @property
    def policy_version(self) -> int:
        """The policy version after the step."""
        return self.optim.policy_version


@dataclass(frozen=True)
class StepProgress:
    """One progress event of a step: queued (queue_position), started, forward / backward
    (layer of num_layers, micro_batch of micro_batches), head, optimizer."""
    state: str
    queue_position: int
    layer: int
    num_layers: int
    micro_batch: int
    micro_batches: int
    elapsed_seconds: float


@dataclass(frozen=True)
class LogprobsResult:
    """ComputeLogprobs: logprobs[s][i] = log p(tokens[i+1] | tokens[..i]) of sequence s
    (double precision when fp64 was asked for), and the policy version; with top_k, top[s][i]
    is the k most likely next tokens at position i as (id, log-prob) pairs, most likely first."""
    logprobs: List[List[float]]
    policy_version: int
    top: List[List[List[Tuple[int, float]]]] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class RoutedExperts:
    """The experts a mixture-of-experts model routed each token of prompt + completion to
    (Sample with ``return_routed_experts``), packed as the server sends them: per token, per
    sparse layer, ``experts_per_token`` ids of ``bytes_per_id`` little-endian signed bytes;
    -1 = the router's choice. Pass the Completion to ``rollout_group`` to replay them."""
    ids: bytes
    bytes_per_id: int
    sparse_layers: int
    experts_per_token: int

    def to_list(self) -> List[int]:
        """The ids as ints, token major, then sparse layer, then slot."""
        w = self.bytes_per_id
        return [int.from_bytes(self.ids[i:i + w], "little", signed=True) for i in range(0, len(self.ids), w)]

    def per_token(self) -> List[List[List[int]]]:
        """[token][sparse layer][slot]."""
        flat, k, layers = self.to_list(), self.experts_per_token, self.sparse_layers
        return [[flat[t + j * k:t + (j + 1) * k] for j in range(layers)] for t in range(0, len(flat), layers * k)]


@dataclass(frozen=True)
class Completion:
    """One sampled completion: tokens, the sampler's log-prob of each, why it ended, its text,
    and (``return_routed_experts``) the experts each token was routed to."""
    prompt_index: int
    tokens: List[int]
    logprobs: List[float]
    finish_reason: str
    text: str
    routed_experts: Optional[RoutedExperts] = None


@dataclass(frozen=True)
class SampleResult:
    """Sample: the completions, prompt by prompt (n each), and the policy version that sampled them."""
    completions: List[Completion]
    policy_version: int

    def for_prompt(self, index: int) -> List[Completion]:
        """The completions of prompt ``index``."""
        return [c for c in self.completions if c.prompt_index == index]


@dataclass(frozen=True)
class TokenizedText:
    """Tokenize: the ids of one input, the loss mask of a conversation's trained assistant
    tokens (empty for plain text) and a conversation's rendered text."""
    ids: List[int]
    loss_mask: List[int]
    text: str


@dataclass(frozen=True)
class CheckpointInfo:
    """SaveCheckpoint: the name, step, policy version and size of the saved state."""
    name: str
    step: int
    policy_version: int
    bytes: int


@dataclass(frozen=True)
class LoadedCheckpoint:
    """LoadCheckpoint: the name, step and policy version restored."""
    name: str
    step: int
    policy_version: int


@dataclass(frozen=True)
class MemoryEstimate:
    """EstimateMemory: predicted bytes of a step by kind, the budget, and whether it fits."""
    weights_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    total_bytes: int
    budget_bytes: int
    fits: bool
    engine: str
    chunk: int
    logits_chunk: int
    key_chunk: int
    offloaded_bytes: int


@dataclass(frozen=True)
class PolicyUpdate:
    """WatchPolicy: one new policy version, what produced it and its training statistics."""
    policy_version: int
    step: int
    source: str
    loss: float
    reward_mean: float
    kl: float
    clip_fraction: float
    tokens: int
    groups_consumed: int
    groups_dropped: int
    metrics: Dict[str, float]


@dataclass(frozen=True)
class RolloutAck:
    """PushRollouts: one group's acknowledgement (accepted | duplicate | stale | invalid)."""
    index: int
    group_id: str
    status: str
    message: str
    queue_depth: int
    policy_version: int


@dataclass(frozen=True)
class RolloutStats:
    """GetRolloutStats: counters of the session's rollout queue."""
    queue_depth: int
    accepted: int
    consumed: int
    dropped_stale: int
    duplicates: int
    invalid: int
    steps_run: int
    last_step_seconds: float
    groups_per_step: int
    max_staleness: int
    policy_version: int
    in_step: int  # taken by the running rollout step (neither consumed nor queued yet)


@dataclass(frozen=True)
class ExportedWeights:
    """ExportWeights written as a folder: ``path``, ``format`` ("model": model.safetensors +
    config.json, "peft_adapter": adapter_model.safetensors + adapter_config.json), every file
    written (relative names, the weights first), the SHA-256 of the weights, the policy
    version served and the server's note (set when it is not the version asked for)."""
    path: str
    format: str
    files: List[str]
    sha256: str
    policy_version: int
    note: str


@dataclass(frozen=True)
class CustomLossResult:
    """forward_backward_custom: the client loss and its metrics, the log-probs it was computed
    from (float64), the weights sent (dL/dlogp) and the server's ForwardBackward result."""
    loss: float
    metrics: Dict[str, float]
    logprobs: List[List[float]]
    weights: List[List[float]]
    policy_version: int
    forward_backward: ForwardBackwardResult
