from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AdamParams(_message.Message):
    __slots__ = ["beta1", "beta2", "eps", "grad_clip_norm", "learning_rate", "weight_decay"]
    BETA1_FIELD_NUMBER: _ClassVar[int]
    BETA2_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    GRAD_CLIP_NORM_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    beta1: float
    beta2: float
    eps: float
    grad_clip_norm: float
    learning_rate: float
    weight_decay: float
    def __init__(self, learning_rate: _Optional[float] = ..., beta1: _Optional[float] = ..., beta2: _Optional[float] = ..., eps: _Optional[float] = ..., weight_decay: _Optional[float] = ..., grad_clip_norm: _Optional[float] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ["data", "dpo", "grpo", "sft", "weighted"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DPO_FIELD_NUMBER: _ClassVar[int]
    GRPO_FIELD_NUMBER: _ClassVar[int]
    SFT_FIELD_NUMBER: _ClassVar[int]
    WEIGHTED_FIELD_NUMBER: _ClassVar[int]
    data: DatumBatch
    dpo: DpoBatch
    grpo: GrpoBatch
    sft: SftBatch
    weighted: WeightedLogprobsBatch
    def __init__(self, sft: _Optional[_Union[SftBatch, _Mapping]] = ..., dpo: _Optional[_Union[DpoBatch, _Mapping]] = ..., grpo: _Optional[_Union[GrpoBatch, _Mapping]] = ..., weighted: _Optional[_Union[WeightedLogprobsBatch, _Mapping]] = ..., data: _Optional[_Union[DatumBatch, _Mapping]] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ["content", "reasoning_content", "role", "train"]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    REASONING_CONTENT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TRAIN_FIELD_NUMBER: _ClassVar[int]
    content: str
    reasoning_content: str
    role: str
    train: bool
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., reasoning_content: _Optional[str] = ..., train: bool = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ["finish_reason", "logprobs", "prompt_index", "routed_experts", "text", "tokens"]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    finish_reason: str
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    prompt_index: int
    routed_experts: RoutedExperts
    text: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, prompt_index: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[str] = ..., text: _Optional[str] = ..., routed_experts: _Optional[_Union[RoutedExperts, _Mapping]] = ...) -> None: ...

class ComputeLogprobsRequest(_message.Message):
    __slots__ = ["fp64", "reference", "sequences", "session", "snapshot", "temperature", "top_k"]
    FP64_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    fp64: bool
    reference: bool
    sequences: _containers.RepeatedCompositeFieldContainer[TokenSequence]
    session: str
    snapshot: str
    temperature: float
    top_k: int
    def __init__(self, sequences: _Optional[_Iterable[_Union[TokenSequence, _Mapping]]] = ..., reference: bool = ..., temperature: _Optional[float] = ..., session: _Optional[str] = ..., fp64: bool = ..., top_k: _Optional[int] = ..., snapshot: _Optional[str] = ...) -> None: ...

class ComputeLogprobsResponse(_message.Message):
    __slots__ = ["policy_version", "sequences"]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    sequences: _containers.RepeatedCompositeFieldContainer[SequenceLogprobs]
    def __init__(self, sequences: _Optional[_Iterable[_Union[SequenceLogprobs, _Mapping]]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class ConfigValue(_message.Message):
    __slots__ = ["flag", "number", "text"]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    flag: bool
    number: float
    text: str
    def __init__(self, number: _Optional[float] = ..., text: _Optional[str] = ..., flag: bool = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ["adapter", "full", "lora", "name", "request_id", "rollouts", "training"]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    adapter: PeftAdapter
    full: bool
    lora: LoraConfig
    name: str
    request_id: str
    rollouts: RolloutConfig
    training: TrainingConfig
    def __init__(self, request_id: _Optional[str] = ..., name: _Optional[str] = ..., lora: _Optional[_Union[LoraConfig, _Mapping]] = ..., adapter: _Optional[_Union[PeftAdapter, _Mapping]] = ..., full: bool = ..., training: _Optional[_Union[TrainingConfig, _Mapping]] = ..., rollouts: _Optional[_Union[RolloutConfig, _Mapping]] = ...) -> None: ...

class Datum(_message.Message):
    __slots__ = ["loss_fn_inputs", "model_input"]
    class LossFnInputsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: TensorData
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[TensorData, _Mapping]] = ...) -> None: ...
    LOSS_FN_INPUTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_INPUT_FIELD_NUMBER: _ClassVar[int]
    loss_fn_inputs: _containers.MessageMap[str, TensorData]
    model_input: ModelInput
    def __init__(self, model_input: _Optional[_Union[ModelInput, _Mapping]] = ..., loss_fn_inputs: _Optional[_Mapping[str, TensorData]] = ...) -> None: ...

class DatumBatch(_message.Message):
    __slots__ = ["data"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: _containers.RepeatedCompositeFieldContainer[Datum]
    def __init__(self, data: _Optional[_Iterable[_Union[Datum, _Mapping]]] = ...) -> None: ...

class DeleteSessionRequest(_message.Message):
    __slots__ = ["name", "request_id"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    request_id: str
    def __init__(self, request_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DeleteSessionResponse(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteSnapshotRequest(_message.Message):
    __slots__ = ["name", "request_id", "session"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    request_id: str
    session: str
    def __init__(self, request_id: _Optional[str] = ..., session: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DeleteSnapshotResponse(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ["sequences", "skip_special_tokens"]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedCompositeFieldContainer[TokenSequence]
    skip_special_tokens: bool
    def __init__(self, sequences: _Optional[_Iterable[_Union[TokenSequence, _Mapping]]] = ..., skip_special_tokens: bool = ...) -> None: ...

class DetokenizeResponse(_message.Message):
    __slots__ = ["texts"]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    texts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, texts: _Optional[_Iterable[str]] = ...) -> None: ...

class DpoBatch(_message.Message):
    __slots__ = ["pairs"]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    pairs: _containers.RepeatedCompositeFieldContainer[DpoPair]
    def __init__(self, pairs: _Optional[_Iterable[_Union[DpoPair, _Mapping]]] = ...) -> None: ...

class DpoOptions(_message.Message):
    __slots__ = ["beta", "label_smoothing", "loss_type", "normalizer"]
    BETA_FIELD_NUMBER: _ClassVar[int]
    LABEL_SMOOTHING_FIELD_NUMBER: _ClassVar[int]
    LOSS_TYPE_FIELD_NUMBER: _ClassVar[int]
    NORMALIZER_FIELD_NUMBER: _ClassVar[int]
    beta: float
    label_smoothing: float
    loss_type: str
    normalizer: float
    def __init__(self, beta: _Optional[float] = ..., loss_type: _Optional[str] = ..., label_smoothing: _Optional[float] = ..., normalizer: _Optional[float] = ...) -> None: ...

class DpoPair(_message.Message):
    __slots__ = ["chosen", "chosen_text", "prompt", "prompt_text", "ref_chosen_logp", "ref_rejected_logp", "rejected", "rejected_text"]
    CHOSEN_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_TEXT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    REF_CHOSEN_LOGP_FIELD_NUMBER: _ClassVar[int]
    REF_REJECTED_LOGP_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_TEXT_FIELD_NUMBER: _ClassVar[int]
    chosen: _containers.RepeatedScalarFieldContainer[int]
    chosen_text: Text
    prompt: _containers.RepeatedScalarFieldContainer[int]
    prompt_text: Text
    ref_chosen_logp: float
    ref_rejected_logp: float
    rejected: _containers.RepeatedScalarFieldContainer[int]
    rejected_text: Text
    def __init__(self, prompt: _Optional[_Iterable[int]] = ..., chosen: _Optional[_Iterable[int]] = ..., rejected: _Optional[_Iterable[int]] = ..., prompt_text: _Optional[_Union[Text, _Mapping]] = ..., chosen_text: _Optional[_Union[Text, _Mapping]] = ..., rejected_text: _Optional[_Union[Text, _Mapping]] = ..., ref_chosen_logp: _Optional[float] = ..., ref_rejected_logp: _Optional[float] = ...) -> None: ...

class EngineOptions(_message.Message):
    __slots__ = ["chunk", "engine", "key_chunk", "logits_chunk", "router_aux_loss_coef"]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    KEY_CHUNK_FIELD_NUMBER: _ClassVar[int]
    LOGITS_CHUNK_FIELD_NUMBER: _ClassVar[int]
    ROUTER_AUX_LOSS_COEF_FIELD_NUMBER: _ClassVar[int]
    chunk: int
    engine: str
    key_chunk: int
    logits_chunk: int
    router_aux_loss_coef: float
    def __init__(self, engine: _Optional[str] = ..., chunk: _Optional[int] = ..., logits_chunk: _Optional[int] = ..., key_chunk: _Optional[int] = ..., router_aux_loss_coef: _Optional[float] = ...) -> None: ...

class EstimateMemoryRequest(_message.Message):
    __slots__ = ["batch", "engine", "seq_len", "session"]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    batch: int
    engine: EngineOptions
    seq_len: int
    session: str
    def __init__(self, seq_len: _Optional[int] = ..., batch: _Optional[int] = ..., engine: _Optional[_Union[EngineOptions, _Mapping]] = ..., session: _Optional[str] = ...) -> None: ...

class EstimateMemoryResponse(_message.Message):
    __slots__ = ["activation_bytes", "budget_bytes", "chunk", "engine", "fits", "gradient_bytes", "key_chunk", "logits_chunk", "offloaded_bytes", "optimizer_bytes", "total_bytes", "weights_bytes"]
    ACTIVATION_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    FITS_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    KEY_CHUNK_FIELD_NUMBER: _ClassVar[int]
    LOGITS_CHUNK_FIELD_NUMBER: _ClassVar[int]
    OFFLOADED_BYTES_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_BYTES_FIELD_NUMBER: _ClassVar[int]
    activation_bytes: int
    budget_bytes: int
    chunk: int
    engine: str
    fits: bool
    gradient_bytes: int
    key_chunk: int
    logits_chunk: int
    offloaded_bytes: int
    optimizer_bytes: int
    total_bytes: int
    weights_bytes: int
    def __init__(self, weights_bytes: _Optional[int] = ..., gradient_bytes: _Optional[int] = ..., optimizer_bytes: _Optional[int] = ..., activation_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., budget_bytes: _Optional[int] = ..., fits: bool = ..., engine: _Optional[str] = ..., chunk: _Optional[int] = ..., logits_chunk: _Optional[int] = ..., key_chunk: _Optional[int] = ..., offloaded_bytes: _Optional[int] = ...) -> None: ...

class ExportWeightsRequest(_message.Message):
    __slots__ = ["max_chunk_bytes", "merged", "session", "snapshot", "version", "with_files"]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    MERGED_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WITH_FILES_FIELD_NUMBER: _ClassVar[int]
    max_chunk_bytes: int
    merged: bool
    session: str
    snapshot: str
    version: int
    with_files: bool
    def __init__(self, merged: bool = ..., max_chunk_bytes: _Optional[int] = ..., version: _Optional[int] = ..., session: _Optional[str] = ..., with_files: bool = ..., snapshot: _Optional[str] = ...) -> None: ...

class ForwardBackwardRequest(_message.Message):
    __slots__ = ["batch", "dpo", "engine", "grpo", "loss_fn_config", "objective", "request_id", "return_logprobs", "session", "sft", "weighted"]
    class LossFnConfigEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ConfigValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ConfigValue, _Mapping]] = ...) -> None: ...
    BATCH_FIELD_NUMBER: _ClassVar[int]
    DPO_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    GRPO_FIELD_NUMBER: _ClassVar[int]
    LOSS_FN_CONFIG_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RETURN_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SFT_FIELD_NUMBER: _ClassVar[int]
    WEIGHTED_FIELD_NUMBER: _ClassVar[int]
    batch: Batch
    dpo: DpoOptions
    engine: EngineOptions
    grpo: GrpoOptions
    loss_fn_config: _containers.MessageMap[str, ConfigValue]
    objective: str
    request_id: str
    return_logprobs: bool
    session: str
    sft: SftOptions
    weighted: WeightedOptions
    def __init__(self, request_id: _Optional[str] = ..., batch: _Optional[_Union[Batch, _Mapping]] = ..., objective: _Optional[str] = ..., sft: _Optional[_Union[SftOptions, _Mapping]] = ..., dpo: _Optional[_Union[DpoOptions, _Mapping]] = ..., grpo: _Optional[_Union[GrpoOptions, _Mapping]] = ..., weighted: _Optional[_Union[WeightedOptions, _Mapping]] = ..., engine: _Optional[_Union[EngineOptions, _Mapping]] = ..., session: _Optional[str] = ..., loss_fn_config: _Optional[_Mapping[str, ConfigValue]] = ..., return_logprobs: bool = ...) -> None: ...

class ForwardBackwardResponse(_message.Message):
    __slots__ = ["logprobs", "policy_version", "stats"]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[SequenceLogprobs]
    policy_version: int
    stats: StepStats
    def __init__(self, stats: _Optional[_Union[StepStats, _Mapping]] = ..., policy_version: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[SequenceLogprobs, _Mapping]]] = ...) -> None: ...

class GetHistoryRequest(_message.Message):
    __slots__ = ["after_index", "max_records", "session"]
    AFTER_INDEX_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    after_index: int
    max_records: int
    session: str
    def __init__(self, session: _Optional[str] = ..., after_index: _Optional[int] = ..., max_records: _Optional[int] = ...) -> None: ...

class GetHistoryResponse(_message.Message):
    __slots__ = ["file", "first_index", "last_index", "records"]
    FILE_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    file: str
    first_index: int
    last_index: int
    records: _containers.RepeatedCompositeFieldContainer[HistoryRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[HistoryRecord, _Mapping]]] = ..., first_index: _Optional[int] = ..., last_index: _Optional[int] = ..., file: _Optional[str] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ["session"]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    def __init__(self, session: _Optional[str] = ...) -> None: ...

class GetInfoResponse(_message.Message):
    __slots__ = ["architecture", "chunk", "context_parallel", "device", "dtype", "engine", "head_dim", "hidden_size", "key_chunk", "learning_rate", "logits_chunk", "max_sequence_length", "max_tokens_per_request", "num_heads", "num_kv_heads", "num_layers", "num_parameters", "objectives", "offload_layer_inputs", "optimizer", "pending_micro_batches", "policy_version", "reference_model", "runtime", "server_version", "session", "sessions", "step", "tokenizer", "vocab_size", "world_size"]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    KEY_CHUNK_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    LOGITS_CHUNK_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQUENCE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    NUM_HEADS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVES_FIELD_NUMBER: _ClassVar[int]
    OFFLOAD_LAYER_INPUTS_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    PENDING_MICRO_BATCHES_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_MODEL_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    architecture: str
    chunk: int
    context_parallel: int
    device: str
    dtype: str
    engine: str
    head_dim: int
    hidden_size: int
    key_chunk: int
    learning_rate: float
    logits_chunk: int
    max_sequence_length: int
    max_tokens_per_request: int
    num_heads: int
    num_kv_heads: int
    num_layers: int
    num_parameters: int
    objectives: _containers.RepeatedCompositeFieldContainer[ObjectiveInfo]
    offload_layer_inputs: bool
    optimizer: str
    pending_micro_batches: int
    policy_version: int
    reference_model: bool
    runtime: str
    server_version: str
    session: SessionInfo
    sessions: bool
    step: int
    tokenizer: TokenizerInfo
    vocab_size: int
    world_size: int
    def __init__(self, architecture: _Optional[str] = ..., num_layers: _Optional[int] = ..., hidden_size: _Optional[int] = ..., num_heads: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., vocab_size: _Optional[int] = ..., num_parameters: _Optional[int] = ..., dtype: _Optional[str] = ..., device: _Optional[str] = ..., engine: _Optional[str] = ..., chunk: _Optional[int] = ..., logits_chunk: _Optional[int] = ..., policy_version: _Optional[int] = ..., step: _Optional[int] = ..., world_size: _Optional[int] = ..., optimizer: _Optional[str] = ..., learning_rate: _Optional[float] = ..., max_sequence_length: _Optional[int] = ..., max_tokens_per_request: _Optional[int] = ..., reference_model: bool = ..., server_version: _Optional[str] = ..., runtime: _Optional[str] = ..., pending_micro_batches: _Optional[int] = ..., key_chunk: _Optional[int] = ..., sessions: bool = ..., session: _Optional[_Union[SessionInfo, _Mapping]] = ..., tokenizer: _Optional[_Union[TokenizerInfo, _Mapping]] = ..., offload_layer_inputs: bool = ..., objectives: _Optional[_Iterable[_Union[ObjectiveInfo, _Mapping]]] = ..., context_parallel: _Optional[int] = ...) -> None: ...

class GetRolloutStatsRequest(_message.Message):
    __slots__ = ["session"]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    def __init__(self, session: _Optional[str] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ["name"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GrpoBatch(_message.Message):
    __slots__ = ["groups"]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GrpoGroup]
    def __init__(self, groups: _Optional[_Iterable[_Union[GrpoGroup, _Mapping]]] = ...) -> None: ...

class GrpoCompletion(_message.Message):
    __slots__ = ["advantages", "logprobs", "reward", "routed_experts", "text", "tokens"]
    ADVANTAGES_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    advantages: _containers.RepeatedScalarFieldContainer[float]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    reward: float
    routed_experts: RoutedExperts
    text: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., reward: _Optional[float] = ..., logprobs: _Optional[_Iterable[float]] = ..., advantages: _Optional[_Iterable[float]] = ..., text: _Optional[str] = ..., routed_experts: _Optional[_Union[RoutedExperts, _Mapping]] = ...) -> None: ...

class GrpoGroup(_message.Message):
    __slots__ = ["completions", "group_id", "policy_version", "prompt", "prompt_text"]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[GrpoCompletion]
    group_id: str
    policy_version: int
    prompt: _containers.RepeatedScalarFieldContainer[int]
    prompt_text: Text
    def __init__(self, prompt: _Optional[_Iterable[int]] = ..., completions: _Optional[_Iterable[_Union[GrpoCompletion, _Mapping]]] = ..., group_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., prompt_text: _Optional[_Union[Text, _Mapping]] = ...) -> None: ...

class GrpoOptions(_message.Message):
    __slots__ = ["beta", "entropy", "epsilon_high", "epsilon_low", "importance_sampling_level", "loss_type", "max_completion_length", "normalizer", "old_logprobs", "scale_rewards", "temperature", "tis_cap"]
    BETA_FIELD_NUMBER: _ClassVar[int]
    ENTROPY_FIELD_NUMBER: _ClassVar[int]
    EPSILON_HIGH_FIELD_NUMBER: _ClassVar[int]
    EPSILON_LOW_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_SAMPLING_LEVEL_FIELD_NUMBER: _ClassVar[int]
    LOSS_TYPE_FIELD_NUMBER: _ClassVar[int]
    MAX_COMPLETION_LENGTH_FIELD_NUMBER: _ClassVar[int]
    NORMALIZER_FIELD_NUMBER: _ClassVar[int]
    OLD_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SCALE_REWARDS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TIS_CAP_FIELD_NUMBER: _ClassVar[int]
    beta: float
    entropy: bool
    epsilon_high: float
    epsilon_low: float
    importance_sampling_level: str
    loss_type: str
    max_completion_length: float
    normalizer: float
    old_logprobs: str
    scale_rewards: str
    temperature: float
    tis_cap: float
    def __init__(self, beta: _Optional[float] = ..., epsilon_low: _Optional[float] = ..., epsilon_high: _Optional[float] = ..., loss_type: _Optional[str] = ..., scale_rewards: _Optional[str] = ..., importance_sampling_level: _Optional[str] = ..., temperature: _Optional[float] = ..., old_logprobs: _Optional[str] = ..., tis_cap: _Optional[float] = ..., max_completion_length: _Optional[float] = ..., normalizer: _Optional[float] = ..., entropy: bool = ...) -> None: ...

class HistoryRecord(_message.Message):
    __slots__ = ["forward_backwards", "grad_norm", "groups_consumed", "index", "learning_rate", "loss", "metrics", "peak_memory_bytes", "policy_version", "seconds", "skip_reason", "skipped", "source", "step", "time", "tokens", "tokens_per_second"]
    class MetricsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    FORWARD_BACKWARDS_FIELD_NUMBER: _ClassVar[int]
    GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    GROUPS_CONSUMED_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    SKIP_REASON_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    forward_backwards: int
    grad_norm: float
    groups_consumed: int
    index: int
    learning_rate: float
    loss: float
    metrics: _containers.ScalarMap[str, float]
    peak_memory_bytes: int
    policy_version: int
    seconds: float
    skip_reason: str
    skipped: bool
    source: str
    step: int
    time: float
    tokens: int
    tokens_per_second: float
    def __init__(self, index: _Optional[int] = ..., step: _Optional[int] = ..., policy_version: _Optional[int] = ..., source: _Optional[str] = ..., time: _Optional[float] = ..., loss: _Optional[float] = ..., tokens: _Optional[int] = ..., forward_backwards: _Optional[int] = ..., tokens_per_second: _Optional[float] = ..., seconds: _Optional[float] = ..., peak_memory_bytes: _Optional[int] = ..., grad_norm: _Optional[float] = ..., learning_rate: _Optional[float] = ..., skipped: bool = ..., skip_reason: _Optional[str] = ..., groups_consumed: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ["max_resident_sessions", "max_sessions", "sessions"]
    MAX_RESIDENT_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    max_resident_sessions: int
    max_sessions: int
    sessions: _containers.RepeatedCompositeFieldContainer[SessionInfo]
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionInfo, _Mapping]]] = ..., max_sessions: _Optional[int] = ..., max_resident_sessions: _Optional[int] = ...) -> None: ...

class ListSnapshotsRequest(_message.Message):
    __slots__ = ["session"]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    def __init__(self, session: _Optional[str] = ...) -> None: ...

class ListSnapshotsResponse(_message.Message):
    __slots__ = ["max_snapshot_bytes", "max_snapshots", "snapshots"]
    MAX_SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    MAX_SNAPSHOT_BYTES_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    max_snapshot_bytes: int
    max_snapshots: int
    snapshots: _containers.RepeatedCompositeFieldContainer[SnapshotInfo]
    def __init__(self, snapshots: _Optional[_Iterable[_Union[SnapshotInfo, _Mapping]]] = ..., max_snapshots: _Optional[int] = ..., max_snapshot_bytes: _Optional[int] = ...) -> None: ...

class LoadCheckpointRequest(_message.Message):
    __slots__ = ["name", "request_id", "session"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    request_id: str
    session: str
    def __init__(self, request_id: _Optional[str] = ..., name: _Optional[str] = ..., session: _Optional[str] = ...) -> None: ...

class LoadCheckpointResponse(_message.Message):
    __slots__ = ["name", "policy_version", "step"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    name: str
    policy_version: int
    step: int
    def __init__(self, name: _Optional[str] = ..., step: _Optional[int] = ..., policy_version: _Optional[int] = ...) -> None: ...

class LoraConfig(_message.Message):
    __slots__ = ["alpha", "modules_to_save", "r", "seed", "target_modules", "use_rslora"]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    MODULES_TO_SAVE_FIELD_NUMBER: _ClassVar[int]
    R_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODULES_FIELD_NUMBER: _ClassVar[int]
    USE_RSLORA_FIELD_NUMBER: _ClassVar[int]
    alpha: float
    modules_to_save: _containers.RepeatedScalarFieldContainer[str]
    r: int
    seed: int
    target_modules: _containers.RepeatedScalarFieldContainer[str]
    use_rslora: bool
    def __init__(self, r: _Optional[int] = ..., alpha: _Optional[float] = ..., target_modules: _Optional[_Iterable[str]] = ..., use_rslora: bool = ..., seed: _Optional[int] = ..., modules_to_save: _Optional[_Iterable[str]] = ...) -> None: ...

class ModelInput(_message.Message):
    __slots__ = ["loss_mask", "text", "tokens"]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    loss_mask: _containers.RepeatedScalarFieldContainer[int]
    text: Text
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., text: _Optional[_Union[Text, _Mapping]] = ..., loss_mask: _Optional[_Iterable[int]] = ...) -> None: ...

class ObjectiveInfo(_message.Message):
    __slots__ = ["batch_kind", "inputs", "name", "optional_inputs", "options"]
    BATCH_KIND_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OPTIONAL_INPUTS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    batch_kind: str
    inputs: _containers.RepeatedScalarFieldContainer[str]
    name: str
    optional_inputs: _containers.RepeatedScalarFieldContainer[str]
    options: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., batch_kind: _Optional[str] = ..., options: _Optional[_Iterable[str]] = ..., inputs: _Optional[_Iterable[str]] = ..., optional_inputs: _Optional[_Iterable[str]] = ...) -> None: ...

class OptimStepRequest(_message.Message):
    __slots__ = ["adam_params", "request_id", "session"]
    ADAM_PARAMS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    adam_params: AdamParams
    request_id: str
    session: str
    def __init__(self, request_id: _Optional[str] = ..., session: _Optional[str] = ..., adam_params: _Optional[_Union[AdamParams, _Mapping]] = ...) -> None: ...

class OptimStepResponse(_message.Message):
    __slots__ = ["grad_norm", "learning_rate", "policy_version", "skip_reason", "skipped", "step"]
    GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    SKIP_REASON_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    grad_norm: float
    learning_rate: float
    policy_version: int
    skip_reason: str
    skipped: bool
    step: int
    def __init__(self, policy_version: _Optional[int] = ..., step: _Optional[int] = ..., learning_rate: _Optional[float] = ..., grad_norm: _Optional[float] = ..., skipped: bool = ..., skip_reason: _Optional[str] = ...) -> None: ...

class OptimizerConfig(_message.Message):
    __slots__ = ["beta1", "beta2", "eps", "lr", "momentum", "name", "weight_decay"]
    BETA1_FIELD_NUMBER: _ClassVar[int]
    BETA2_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    beta1: float
    beta2: float
    eps: float
    lr: float
    momentum: float
    name: str
    weight_decay: float
    def __init__(self, name: _Optional[str] = ..., lr: _Optional[float] = ..., beta1: _Optional[float] = ..., beta2: _Optional[float] = ..., eps: _Optional[float] = ..., weight_decay: _Optional[float] = ..., momentum: _Optional[float] = ...) -> None: ...

class PeftAdapter(_message.Message):
    __slots__ = ["adapter_config_json", "adapter_model_safetensors"]
    ADAPTER_CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_MODEL_SAFETENSORS_FIELD_NUMBER: _ClassVar[int]
    adapter_config_json: str
    adapter_model_safetensors: bytes
    def __init__(self, adapter_config_json: _Optional[str] = ..., adapter_model_safetensors: _Optional[bytes] = ...) -> None: ...

class PolicyUpdate(_message.Message):
    __slots__ = ["clip_fraction", "groups_consumed", "groups_dropped", "kl", "loss", "metrics", "policy_version", "reward_mean", "source", "step", "tokens"]
    class MetricsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CLIP_FRACTION_FIELD_NUMBER: _ClassVar[int]
    GROUPS_CONSUMED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    KL_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    clip_fraction: float
    groups_consumed: int
    groups_dropped: int
    kl: float
    loss: float
    metrics: _containers.ScalarMap[str, float]
    policy_version: int
    reward_mean: float
    source: str
    step: int
    tokens: int
    def __init__(self, policy_version: _Optional[int] = ..., step: _Optional[int] = ..., source: _Optional[str] = ..., loss: _Optional[float] = ..., reward_mean: _Optional[float] = ..., kl: _Optional[float] = ..., clip_fraction: _Optional[float] = ..., tokens: _Optional[int] = ..., groups_consumed: _Optional[int] = ..., groups_dropped: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class PushRolloutsRequest(_message.Message):
    __slots__ = ["groups", "session"]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[RolloutGroup]
    session: str
    def __init__(self, groups: _Optional[_Iterable[_Union[RolloutGroup, _Mapping]]] = ..., session: _Optional[str] = ...) -> None: ...

class PushRolloutsResponse(_message.Message):
    __slots__ = ["acks"]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[RolloutAck]
    def __init__(self, acks: _Optional[_Iterable[_Union[RolloutAck, _Mapping]]] = ...) -> None: ...

class RolloutAck(_message.Message):
    __slots__ = ["group_id", "index", "message", "policy_version", "queue_depth", "status"]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    index: int
    message: str
    policy_version: int
    queue_depth: int
    status: str
    def __init__(self, index: _Optional[int] = ..., group_id: _Optional[str] = ..., status: _Optional[str] = ..., message: _Optional[str] = ..., queue_depth: _Optional[int] = ..., policy_version: _Optional[int] = ...) -> None: ...

class RolloutConfig(_message.Message):
    __slots__ = ["groups_per_step", "grpo", "max_staleness"]
    GROUPS_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    GRPO_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    groups_per_step: int
    grpo: GrpoOptions
    max_staleness: int
    def __init__(self, groups_per_step: _Optional[int] = ..., max_staleness: _Optional[int] = ..., grpo: _Optional[_Union[GrpoOptions, _Mapping]] = ...) -> None: ...

class RolloutGroup(_message.Message):
    __slots__ = ["completions", "group_id", "policy_version", "prompt", "prompt_text", "session"]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[GrpoCompletion]
    group_id: str
    policy_version: int
    prompt: _containers.RepeatedScalarFieldContainer[int]
    prompt_text: Text
    session: str
    def __init__(self, prompt: _Optional[_Iterable[int]] = ..., prompt_text: _Optional[_Union[Text, _Mapping]] = ..., completions: _Optional[_Iterable[_Union[GrpoCompletion, _Mapping]]] = ..., policy_version: _Optional[int] = ..., group_id: _Optional[str] = ..., session: _Optional[str] = ...) -> None: ...

class RolloutStats(_message.Message):
    __slots__ = ["accepted", "consumed", "dropped_stale", "duplicates", "groups_per_step", "in_step", "invalid", "last_step_seconds", "max_staleness", "policy_version", "queue_depth", "steps_run"]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_STALE_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    INVALID_FIELD_NUMBER: _ClassVar[int]
    IN_STEP_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    STEPS_RUN_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    consumed: int
    dropped_stale: int
    duplicates: int
    groups_per_step: int
    in_step: int
    invalid: int
    last_step_seconds: float
    max_staleness: int
    policy_version: int
    queue_depth: int
    steps_run: int
    def __init__(self, queue_depth: _Optional[int] = ..., accepted: _Optional[int] = ..., consumed: _Optional[int] = ..., dropped_stale: _Optional[int] = ..., duplicates: _Optional[int] = ..., invalid: _Optional[int] = ..., steps_run: _Optional[int] = ..., last_step_seconds: _Optional[float] = ..., groups_per_step: _Optional[int] = ..., max_staleness: _Optional[int] = ..., policy_version: _Optional[int] = ..., in_step: _Optional[int] = ...) -> None: ...

class RoutedExperts(_message.Message):
    __slots__ = ["bytes_per_id", "experts_per_token", "ids", "sparse_layers"]
    BYTES_PER_ID_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    SPARSE_LAYERS_FIELD_NUMBER: _ClassVar[int]
    bytes_per_id: int
    experts_per_token: int
    ids: bytes
    sparse_layers: int
    def __init__(self, ids: _Optional[bytes] = ..., bytes_per_id: _Optional[int] = ..., sparse_layers: _Optional[int] = ..., experts_per_token: _Optional[int] = ...) -> None: ...

class SampleRequest(_message.Message):
    __slots__ = ["ignore_eos", "max_tokens", "n", "prompts", "return_routed_experts", "seed", "session", "snapshot", "stop_tokens", "temperature", "text_prompts", "top_p"]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    RETURN_ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TEXT_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    ignore_eos: bool
    max_tokens: int
    n: int
    prompts: _containers.RepeatedCompositeFieldContainer[TokenSequence]
    return_routed_experts: bool
    seed: int
    session: str
    snapshot: str
    stop_tokens: _containers.RepeatedScalarFieldContainer[int]
    temperature: float
    text_prompts: _containers.RepeatedCompositeFieldContainer[Text]
    top_p: float
    def __init__(self, prompts: _Optional[_Iterable[_Union[TokenSequence, _Mapping]]] = ..., n: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., max_tokens: _Optional[int] = ..., stop_tokens: _Optional[_Iterable[int]] = ..., seed: _Optional[int] = ..., session: _Optional[str] = ..., text_prompts: _Optional[_Iterable[_Union[Text, _Mapping]]] = ..., ignore_eos: bool = ..., return_routed_experts: bool = ..., snapshot: _Optional[str] = ...) -> None: ...

class SampleResponse(_message.Message):
    __slots__ = ["completions", "policy_version"]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    policy_version: int
    def __init__(self, completions: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class SaveCheckpointRequest(_message.Message):
    __slots__ = ["name", "request_id", "session"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    request_id: str
    session: str
    def __init__(self, request_id: _Optional[str] = ..., name: _Optional[str] = ..., session: _Optional[str] = ...) -> None: ...

class SaveCheckpointResponse(_message.Message):
    __slots__ = ["bytes", "name", "policy_version", "step"]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    name: str
    policy_version: int
    step: int
    def __init__(self, name: _Optional[str] = ..., step: _Optional[int] = ..., policy_version: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class SaveWeightsForSamplerRequest(_message.Message):
    __slots__ = ["name", "replace_oldest", "request_id", "session", "ttl_seconds"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REPLACE_OLDEST_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    replace_oldest: bool
    request_id: str
    session: str
    ttl_seconds: float
    def __init__(self, request_id: _Optional[str] = ..., session: _Optional[str] = ..., name: _Optional[str] = ..., ttl_seconds: _Optional[float] = ..., replace_oldest: bool = ...) -> None: ...

class ScheduleConfig(_message.Message):
    __slots__ = ["min_lr_ratio", "total_steps", "type", "warmup_steps"]
    MIN_LR_RATIO_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    WARMUP_STEPS_FIELD_NUMBER: _ClassVar[int]
    min_lr_ratio: float
    total_steps: int
    type: str
    warmup_steps: int
    def __init__(self, type: _Optional[str] = ..., warmup_steps: _Optional[int] = ..., total_steps: _Optional[int] = ..., min_lr_ratio: _Optional[float] = ...) -> None: ...

class SequenceLogprobs(_message.Message):
    __slots__ = ["logprobs", "logprobs_fp64", "top_ids", "top_logprobs"]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FP64_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    logprobs_fp64: _containers.RepeatedScalarFieldContainer[float]
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, logprobs: _Optional[_Iterable[float]] = ..., logprobs_fp64: _Optional[_Iterable[float]] = ..., top_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ["device_bytes", "groups_per_step", "idle_seconds", "kind", "learning_rate", "lora", "max_staleness", "name", "optimizer", "pending_micro_batches", "policy_version", "resident", "step", "trainable_parameters"]
    DEVICE_BYTES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    PENDING_MICRO_BATCHES_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TRAINABLE_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    device_bytes: int
    groups_per_step: int
    idle_seconds: float
    kind: str
    learning_rate: float
    lora: LoraConfig
    max_staleness: int
    name: str
    optimizer: str
    pending_micro_batches: int
    policy_version: int
    resident: bool
    step: int
    trainable_parameters: int
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., lora: _Optional[_Union[LoraConfig, _Mapping]] = ..., step: _Optional[int] = ..., policy_version: _Optional[int] = ..., resident: bool = ..., trainable_parameters: _Optional[int] = ..., device_bytes: _Optional[int] = ..., idle_seconds: _Optional[float] = ..., pending_micro_batches: _Optional[int] = ..., optimizer: _Optional[str] = ..., learning_rate: _Optional[float] = ..., groups_per_step: _Optional[int] = ..., max_staleness: _Optional[int] = ...) -> None: ...

class SftBatch(_message.Message):
    __slots__ = ["examples"]
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    examples: _containers.RepeatedCompositeFieldContainer[SftExample]
    def __init__(self, examples: _Optional[_Iterable[_Union[SftExample, _Mapping]]] = ...) -> None: ...

class SftExample(_message.Message):
    __slots__ = ["completion", "completion_text", "loss_mask", "messages", "prompt", "prompt_text", "text", "tokens"]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TEXT_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    completion: _containers.RepeatedScalarFieldContainer[int]
    completion_text: Text
    loss_mask: _containers.RepeatedScalarFieldContainer[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    prompt: _containers.RepeatedScalarFieldContainer[int]
    prompt_text: Text
    text: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., loss_mask: _Optional[_Iterable[int]] = ..., prompt: _Optional[_Iterable[int]] = ..., completion: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., prompt_text: _Optional[_Union[Text, _Mapping]] = ..., completion_text: _Optional[_Union[Text, _Mapping]] = ...) -> None: ...

class SftOptions(_message.Message):
    __slots__ = ["normalizer"]
    NORMALIZER_FIELD_NUMBER: _ClassVar[int]
    normalizer: float
    def __init__(self, normalizer: _Optional[float] = ...) -> None: ...

class SnapshotInfo(_message.Message):
    __slots__ = ["bytes", "created_unix", "expires_unix", "name", "policy_version", "resident", "session", "step"]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    created_unix: float
    expires_unix: float
    name: str
    policy_version: int
    resident: bool
    session: str
    step: int
    def __init__(self, session: _Optional[str] = ..., name: _Optional[str] = ..., step: _Optional[int] = ..., policy_version: _Optional[int] = ..., bytes: _Optional[int] = ..., created_unix: _Optional[float] = ..., expires_unix: _Optional[float] = ..., resident: bool = ...) -> None: ...

class StepProgress(_message.Message):
    __slots__ = ["elapsed_seconds", "forward_backward", "layer", "micro_batch", "micro_batches", "num_layers", "queue_position", "state", "train_step"]
    ELAPSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_BACKWARD_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCHES_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TRAIN_STEP_FIELD_NUMBER: _ClassVar[int]
    elapsed_seconds: float
    forward_backward: ForwardBackwardResponse
    layer: int
    micro_batch: int
    micro_batches: int
    num_layers: int
    queue_position: int
    state: str
    train_step: TrainStepResponse
    def __init__(self, state: _Optional[str] = ..., queue_position: _Optional[int] = ..., layer: _Optional[int] = ..., num_layers: _Optional[int] = ..., micro_batch: _Optional[int] = ..., micro_batches: _Optional[int] = ..., elapsed_seconds: _Optional[float] = ..., forward_backward: _Optional[_Union[ForwardBackwardResponse, _Mapping]] = ..., train_step: _Optional[_Union[TrainStepResponse, _Mapping]] = ...) -> None: ...

class StepStats(_message.Message):
    __slots__ = ["chunk", "engine", "key_chunk", "logits_chunk", "loss", "metrics", "micro_batches", "offloaded_bytes", "peak_memory_bytes", "queue_seconds", "seconds", "sequences", "targets", "tokens"]
    class MetricsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    KEY_CHUNK_FIELD_NUMBER: _ClassVar[int]
    LOGITS_CHUNK_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCHES_FIELD_NUMBER: _ClassVar[int]
    OFFLOADED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    chunk: int
    engine: str
    key_chunk: int
    logits_chunk: int
    loss: float
    metrics: _containers.ScalarMap[str, float]
    micro_batches: int
    offloaded_bytes: int
    peak_memory_bytes: int
    queue_seconds: float
    seconds: float
    sequences: int
    targets: int
    tokens: int
    def __init__(self, loss: _Optional[float] = ..., metrics: _Optional[_Mapping[str, float]] = ..., tokens: _Optional[int] = ..., targets: _Optional[int] = ..., sequences: _Optional[int] = ..., micro_batches: _Optional[int] = ..., engine: _Optional[str] = ..., chunk: _Optional[int] = ..., logits_chunk: _Optional[int] = ..., key_chunk: _Optional[int] = ..., peak_memory_bytes: _Optional[int] = ..., seconds: _Optional[float] = ..., queue_seconds: _Optional[float] = ..., offloaded_bytes: _Optional[int] = ...) -> None: ...

class TensorData(_message.Message):
    __slots__ = ["float_data", "int_data", "shape"]
    FLOAT_DATA_FIELD_NUMBER: _ClassVar[int]
    INT_DATA_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    float_data: _containers.RepeatedScalarFieldContainer[float]
    int_data: _containers.RepeatedScalarFieldContainer[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, float_data: _Optional[_Iterable[float]] = ..., int_data: _Optional[_Iterable[int]] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class Text(_message.Message):
    __slots__ = ["enable_thinking", "messages", "text"]
    ENABLE_THINKING_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    enable_thinking: bool
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    text: str
    def __init__(self, text: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., enable_thinking: bool = ...) -> None: ...

class TokenSequence(_message.Message):
    __slots__ = ["tokens"]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ["add_generation_prompt", "add_special_tokens", "batch", "inputs"]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    add_generation_prompt: bool
    add_special_tokens: bool
    batch: Batch
    inputs: _containers.RepeatedCompositeFieldContainer[Text]
    def __init__(self, inputs: _Optional[_Iterable[_Union[Text, _Mapping]]] = ..., add_special_tokens: bool = ..., add_generation_prompt: bool = ..., batch: _Optional[_Union[Batch, _Mapping]] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ["batch", "outputs"]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    batch: Batch
    outputs: _containers.RepeatedCompositeFieldContainer[TokenizedText]
    def __init__(self, outputs: _Optional[_Iterable[_Union[TokenizedText, _Mapping]]] = ..., batch: _Optional[_Union[Batch, _Mapping]] = ...) -> None: ...

class TokenizedText(_message.Message):
    __slots__ = ["ids", "loss_mask", "text"]
    IDS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    loss_mask: _containers.RepeatedScalarFieldContainer[int]
    text: str
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., loss_mask: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ...) -> None: ...

class TokenizerInfo(_message.Message):
    __slots__ = ["available", "bos_token", "chat_format", "eos_token", "eos_token_ids", "type", "vocab_size"]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    BOS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CHAT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    available: bool
    bos_token: str
    chat_format: str
    eos_token: str
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    type: str
    vocab_size: int
    def __init__(self, available: bool = ..., type: _Optional[str] = ..., vocab_size: _Optional[int] = ..., chat_format: _Optional[str] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., bos_token: _Optional[str] = ..., eos_token: _Optional[str] = ...) -> None: ...

class TrainStepRequest(_message.Message):
    __slots__ = ["adam_params", "batch", "dpo", "engine", "grpo", "loss_fn_config", "objective", "request_id", "session", "sft", "weighted"]
    class LossFnConfigEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ConfigValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ConfigValue, _Mapping]] = ...) -> None: ...
    ADAM_PARAMS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    DPO_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    GRPO_FIELD_NUMBER: _ClassVar[int]
    LOSS_FN_CONFIG_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SFT_FIELD_NUMBER: _ClassVar[int]
    WEIGHTED_FIELD_NUMBER: _ClassVar[int]
    adam_params: AdamParams
    batch: Batch
    dpo: DpoOptions
    engine: EngineOptions
    grpo: GrpoOptions
    loss_fn_config: _containers.MessageMap[str, ConfigValue]
    objective: str
    request_id: str
    session: str
    sft: SftOptions
    weighted: WeightedOptions
    def __init__(self, request_id: _Optional[str] = ..., batch: _Optional[_Union[Batch, _Mapping]] = ..., objective: _Optional[str] = ..., sft: _Optional[_Union[SftOptions, _Mapping]] = ..., dpo: _Optional[_Union[DpoOptions, _Mapping]] = ..., grpo: _Optional[_Union[GrpoOptions, _Mapping]] = ..., weighted: _Optional[_Union[WeightedOptions, _Mapping]] = ..., engine: _Optional[_Union[EngineOptions, _Mapping]] = ..., session: _Optional[str] = ..., adam_params: _Optional[_Union[AdamParams, _Mapping]] = ..., loss_fn_config: _Optional[_Mapping[str, ConfigValue]] = ...) -> None: ...

class TrainStepResponse(_message.Message):
    __slots__ = ["optim", "stats"]
    OPTIM_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    optim: OptimStepResponse
    stats: StepStats
    def __init__(self, stats: _Optional[_Union[StepStats, _Mapping]] = ..., optim: _Optional[_Union[OptimStepResponse, _Mapping]] = ...) -> None: ...

class TrainingConfig(_message.Message):
    __slots__ = ["max_grad_norm", "optimizer", "schedule", "seed"]
    MAX_GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    max_grad_norm: float
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    seed: int
    def __init__(self, optimizer: _Optional[_Union[OptimizerConfig, _Mapping]] = ..., schedule: _Optional[_Union[ScheduleConfig, _Mapping]] = ..., max_grad_norm: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class WatchPolicyRequest(_message.Message):
    __slots__ = ["session", "since_version"]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SINCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    since_version: int
    def __init__(self, since_version: _Optional[int] = ..., session: _Optional[str] = ...) -> None: ...

class WeightedLogprobsBatch(_message.Message):
    __slots__ = ["policy_version", "sequences"]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    sequences: _containers.RepeatedCompositeFieldContainer[WeightedSequence]
    def __init__(self, sequences: _Optional[_Iterable[_Union[WeightedSequence, _Mapping]]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class WeightedOptions(_message.Message):
    __slots__ = ["temperature"]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    def __init__(self, temperature: _Optional[float] = ...) -> None: ...

class WeightedSequence(_message.Message):
    __slots__ = ["tokens", "weights"]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    weights: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., weights: _Optional[_Iterable[float]] = ...) -> None: ...

class WeightsChunk(_message.Message):
    __slots__ = ["config_json", "data", "file", "format", "last", "note", "offset", "policy_version", "sha256", "total_bytes"]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    config_json: str
    data: bytes
    file: str
    format: str
    last: bool
    note: str
    offset: int
    policy_version: int
    sha256: str
    total_bytes: int
    def __init__(self, policy_version: _Optional[int] = ..., total_bytes: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., sha256: _Optional[str] = ..., config_json: _Optional[str] = ..., last: bool = ..., note: _Optional[str] = ..., format: _Optional[str] = ..., file: _Optional[str] = ...) -> None: ...
