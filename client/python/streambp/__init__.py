"""streambp: the Python SDK of streambp-server (StreamBP exact-backprop training over gRPC).

    import streambp
    service = streambp.ServiceClient("127.0.0.1:50051")
    print(service.info().architecture)
    tc = service.training_client()                       # the default session (the whole model)
    result = tc.train_step(streambp.sft_batch([[1, 5, 9, 13, 17]]))
    futures = [tc.forward_backward_future(b) for b in batches]   # applied in submission order
    tc.optim_step()

Every call has a blocking form, a ``_future`` form (concurrent.futures.Future) and an
``_async`` form (a coroutine); errors raise StreambpError (``.code``, ``.message``). See
client/python/README.md.
"""
from . import custom_loss, data, safetensors
from ._connection import RetryPolicy, StreamIterator, TlsConfig, new_request_id
from .client import ServiceClient
from .custom_loss import LossFn, torch_available
from .data import (batch_from_records, data_batch, datum, dpo_batch, grpo_batch, loss_fn_config, objective_options,
                   parse_jsonl, read_jsonl, rollout_group, sft_batch, tensor_data, text_input, weighted_batch)
from .errors import StreambpError
from .history import HistoryRecord
from .safetensors import Tensor, load_safetensors
from .training import RolloutStream, TrainingClient
from .types import (AdamParams, CheckpointInfo, Completion, CustomLossResult, ExportedWeights, ForwardBackwardResult,
                    LoadedCheckpoint, LogprobsResult, LoraConfig, MemoryEstimate, ObjectiveInfo, OptimStepResult,
                    PolicyUpdate, RolloutAck, RolloutStats, RoutedExperts, SampleResult, ServerInfo, SessionInfo,
                    SessionList, SnapshotInfo, SnapshotList, StepProgress, StepStats, TokenizedText, TokenizerInfo,
                    TrainStepResult)
from .v1 import trainer_pb2 as pb

__version__ = "0.1.0"

__all__ = [
    "ServiceClient", "TrainingClient", "RolloutStream", "StreamIterator", "StreambpError", "RetryPolicy", "TlsConfig",
    "new_request_id", "AdamParams", "LossFn", "torch_available", "pb", "custom_loss", "data", "safetensors",
    "batch_from_records", "dpo_batch", "grpo_batch", "objective_options", "parse_jsonl", "read_jsonl",
    "rollout_group", "sft_batch", "text_input", "weighted_batch", "Tensor", "load_safetensors",
    "datum", "data_batch", "tensor_data", "loss_fn_config",
    "CheckpointInfo", "Completion", "CustomLossResult", "ExportedWeights", "ForwardBackwardResult",
    "LoadedCheckpoint", "LogprobsResult", "LoraConfig", "MemoryEstimate", "ObjectiveInfo", "OptimStepResult",
    "PolicyUpdate",
    "HistoryRecord", "RolloutAck", "RolloutStats", "RoutedExperts", "SampleResult", "ServerInfo", "SessionInfo", "SessionList",
    "SnapshotInfo", "SnapshotList",
    "StepProgress", "StepStats", "TokenizedText", "TokenizerInfo", "TrainStepResult", "__version__",
]
