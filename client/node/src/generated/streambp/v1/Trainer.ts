// Original file: ../../proto/streambp/v1/trainer.proto

import type * as grpc from '@grpc/grpc-js'
import type { MethodDefinition } from '@grpc/proto-loader'
import type { ComputeLogprobsRequest as _streambp_v1_ComputeLogprobsRequest, ComputeLogprobsRequest__Output as _streambp_v1_ComputeLogprobsRequest__Output } from '../../streambp/v1/ComputeLogprobsRequest';
import type { ComputeLogprobsResponse as _streambp_v1_ComputeLogprobsResponse, ComputeLogprobsResponse__Output as _streambp_v1_ComputeLogprobsResponse__Output } from '../../streambp/v1/ComputeLogprobsResponse';
import type { CreateSessionRequest as _streambp_v1_CreateSessionRequest, CreateSessionRequest__Output as _streambp_v1_CreateSessionRequest__Output } from '../../streambp/v1/CreateSessionRequest';
import type { DeleteSessionRequest as _streambp_v1_DeleteSessionRequest, DeleteSessionRequest__Output as _streambp_v1_DeleteSessionRequest__Output } from '../../streambp/v1/DeleteSessionRequest';
import type { DeleteSessionResponse as _streambp_v1_DeleteSessionResponse, DeleteSessionResponse__Output as _streambp_v1_DeleteSessionResponse__Output } from '../../streambp/v1/DeleteSessionResponse';
import type { DeleteSnapshotRequest as _streambp_v1_DeleteSnapshotRequest, DeleteSnapshotRequest__Output as _streambp_v1_DeleteSnapshotRequest__Output } from '../../streambp/v1/DeleteSnapshotRequest';
import type { DeleteSnapshotResponse as _streambp_v1_DeleteSnapshotResponse, DeleteSnapshotResponse__Output as _streambp_v1_DeleteSnapshotResponse__Output } from '../../streambp/v1/DeleteSnapshotResponse';
import type { DetokenizeRequest as _streambp_v1_DetokenizeRequest, DetokenizeRequest__Output as _streambp_v1_DetokenizeRequest__Output } from '../../streambp/v1/DetokenizeRequest';
import type { DetokenizeResponse as _streambp_v1_DetokenizeResponse, DetokenizeResponse__Output as _streambp_v1_DetokenizeResponse__Output } from '../../streambp/v1/DetokenizeResponse';
import type { EstimateMemoryRequest as _streambp_v1_EstimateMemoryRequest, EstimateMemoryRequest__Output as _streambp_v1_EstimateMemoryRequest__Output } from '../../streambp/v1/EstimateMemoryRequest';
import type { EstimateMemoryResponse as _streambp_v1_EstimateMemoryResponse, EstimateMemoryResponse__Output as _streambp_v1_EstimateMemoryResponse__Output } from '../../streambp/v1/EstimateMemoryResponse';
import type { ExportWeightsRequest as _streambp_v1_ExportWeightsRequest, ExportWeightsRequest__Output as _streambp_v1_ExportWeightsRequest__Output } from '../../streambp/v1/ExportWeightsRequest';
import type { ForwardBackwardRequest as _streambp_v1_ForwardBackwardRequest, ForwardBackwardRequest__Output as _streambp_v1_ForwardBackwardRequest__Output } from '../../streambp/v1/ForwardBackwardRequest';
import type { ForwardBackwardResponse as _streambp_v1_ForwardBackwardResponse, ForwardBackwardResponse__Output as _streambp_v1_ForwardBackwardResponse__Output } from '../../streambp/v1/ForwardBackwardResponse';
import type { GetHistoryRequest as _streambp_v1_GetHistoryRequest, GetHistoryRequest__Output as _streambp_v1_GetHistoryRequest__Output } from '../../streambp/v1/GetHistoryRequest';
import type { GetHistoryResponse as _streambp_v1_GetHistoryResponse, GetHistoryResponse__Output as _streambp_v1_GetHistoryResponse__Output } from '../../streambp/v1/GetHistoryResponse';
import type { GetInfoRequest as _streambp_v1_GetInfoRequest, GetInfoRequest__Output as _streambp_v1_GetInfoRequest__Output } from '../../streambp/v1/GetInfoRequest';
import type { GetInfoResponse as _streambp_v1_GetInfoResponse, GetInfoResponse__Output as _streambp_v1_GetInfoResponse__Output } from '../../streambp/v1/GetInfoResponse';
import type { GetRolloutStatsRequest as _streambp_v1_GetRolloutStatsRequest, GetRolloutStatsRequest__Output as _streambp_v1_GetRolloutStatsRequest__Output } from '../../streambp/v1/GetRolloutStatsRequest';
import type { GetSessionRequest as _streambp_v1_GetSessionRequest, GetSessionRequest__Output as _streambp_v1_GetSessionRequest__Output } from '../../streambp/v1/GetSessionRequest';
import type { ListSessionsRequest as _streambp_v1_ListSessionsRequest, ListSessionsRequest__Output as _streambp_v1_ListSessionsRequest__Output } from '../../streambp/v1/ListSessionsRequest';
import type { ListSessionsResponse as _streambp_v1_ListSessionsResponse, ListSessionsResponse__Output as _streambp_v1_ListSessionsResponse__Output } from '../../streambp/v1/ListSessionsResponse';
import type { ListSnapshotsRequest as _streambp_v1_ListSnapshotsRequest, ListSnapshotsRequest__Output as _streambp_v1_ListSnapshotsRequest__Output } from '../../streambp/v1/ListSnapshotsRequest';
import type { ListSnapshotsResponse as _streambp_v1_ListSnapshotsResponse, ListSnapshotsResponse__Output as _streambp_v1_ListSnapshotsResponse__Output } from '../../streambp/v1/ListSnapshotsResponse';
import type { LoadCheckpointRequest as _streambp_v1_LoadCheckpointRequest, LoadCheckpointRequest__Output as _streambp_v1_LoadCheckpointRequest__Output } from '../../streambp/v1/LoadCheckpointRequest';
import type { LoadCheckpointResponse as _streambp_v1_LoadCheckpointResponse, LoadCheckpointResponse__Output as _streambp_v1_LoadCheckpointResponse__Output } from '../../streambp/v1/LoadCheckpointResponse';
import type { OptimStepRequest as _streambp_v1_OptimStepRequest, OptimStepRequest__Output as _streambp_v1_OptimStepRequest__Output } from '../../streambp/v1/OptimStepRequest';
import type { OptimStepResponse as _streambp_v1_OptimStepResponse, OptimStepResponse__Output as _streambp_v1_OptimStepResponse__Output } from '../../streambp/v1/OptimStepResponse';
import type { PolicyUpdate as _streambp_v1_PolicyUpdate, PolicyUpdate__Output as _streambp_v1_PolicyUpdate__Output } from '../../streambp/v1/PolicyUpdate';
import type { PushRolloutsRequest as _streambp_v1_PushRolloutsRequest, PushRolloutsRequest__Output as _streambp_v1_PushRolloutsRequest__Output } from '../../streambp/v1/PushRolloutsRequest';
import type { PushRolloutsResponse as _streambp_v1_PushRolloutsResponse, PushRolloutsResponse__Output as _streambp_v1_PushRolloutsResponse__Output } from '../../streambp/v1/PushRolloutsResponse';
import type { RolloutAck as _streambp_v1_RolloutAck, RolloutAck__Output as _streambp_v1_RolloutAck__Output } from '../../streambp/v1/RolloutAck';
import type { RolloutGroup as _streambp_v1_RolloutGroup, RolloutGroup__Output as _streambp_v1_RolloutGroup__Output } from '../../streambp/v1/RolloutGroup';
import type { RolloutStats as _streambp_v1_RolloutStats, RolloutStats__Output as _streambp_v1_RolloutStats__Output } from '../../streambp/v1/RolloutStats';
import type { SampleRequest as _streambp_v1_SampleRequest, SampleRequest__Output as _streambp_v1_SampleRequest__Output } from '../../streambp/v1/SampleRequest';
import type { SampleResponse as _streambp_v1_SampleResponse, SampleResponse__Output as _streambp_v1_SampleResponse__Output } from '../../streambp/v1/SampleResponse';
import type { SaveCheckpointRequest as _streambp_v1_SaveCheckpointRequest, SaveCheckpointRequest__Output as _streambp_v1_SaveCheckpointRequest__Output } from '../../streambp/v1/SaveCheckpointRequest';
import type { SaveCheckpointResponse as _streambp_v1_SaveCheckpointResponse, SaveCheckpointResponse__Output as _streambp_v1_SaveCheckpointResponse__Output } from '../../streambp/v1/SaveCheckpointResponse';
import type { SaveWeightsForSamplerRequest as _streambp_v1_SaveWeightsForSamplerRequest, SaveWeightsForSamplerRequest__Output as _streambp_v1_SaveWeightsForSamplerRequest__Output } from '../../streambp/v1/SaveWeightsForSamplerRequest';
import type { SessionInfo as _streambp_v1_SessionInfo, SessionInfo__Output as _streambp_v1_SessionInfo__Output } from '../../streambp/v1/SessionInfo';
import type { SnapshotInfo as _streambp_v1_SnapshotInfo, SnapshotInfo__Output as _streambp_v1_SnapshotInfo__Output } from '../../streambp/v1/SnapshotInfo';
import type { StepProgress as _streambp_v1_StepProgress, StepProgress__Output as _streambp_v1_StepProgress__Output } from '../../streambp/v1/StepProgress';
import type { TokenizeRequest as _streambp_v1_TokenizeRequest, TokenizeRequest__Output as _streambp_v1_TokenizeRequest__Output } from '../../streambp/v1/TokenizeRequest';
import type { TokenizeResponse as _streambp_v1_TokenizeResponse, TokenizeResponse__Output as _streambp_v1_TokenizeResponse__Output } from '../../streambp/v1/TokenizeResponse';
import type { TrainStepRequest as _streambp_v1_TrainStepRequest, TrainStepRequest__Output as _streambp_v1_TrainStepRequest__Output } from '../../streambp/v1/TrainStepRequest';
import type { TrainStepResponse as _streambp_v1_TrainStepResponse, TrainStepResponse__Output as _streambp_v1_TrainStepResponse__Output } from '../../streambp/v1/TrainStepResponse';
import type { WatchPolicyRequest as _streambp_v1_WatchPolicyRequest, WatchPolicyRequest__Output as _streambp_v1_WatchPolicyRequest__Output } from '../../streambp/v1/WatchPolicyRequest';
import type { WeightsChunk as _streambp_v1_WeightsChunk, WeightsChunk__Output as _streambp_v1_WeightsChunk__Output } from '../../streambp/v1/WeightsChunk';

export interface TrainerClient extends grpc.Client {
  /**
   * Per-token log-probs of sequences under the policy or the frozen reference model.
   */
  ComputeLogprobs(argument: _streambp_v1_ComputeLogprobsRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_ComputeLogprobsResponse__Output>): grpc.ClientUnaryCall;
  ComputeLogprobs(argument: _streambp_v1_ComputeLogprobsRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_ComputeLogprobsResponse__Output>): grpc.ClientUnaryCall;
  ComputeLogprobs(argument: _streambp_v1_ComputeLogprobsRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_ComputeLogprobsResponse__Output>): grpc.ClientUnaryCall;
  ComputeLogprobs(argument: _streambp_v1_ComputeLogprobsRequest, callback: grpc.requestCallback<_streambp_v1_ComputeLogprobsResponse__Output>): grpc.ClientUnaryCall;
  /**
   * Per-token log-probs of sequences under the policy or the frozen reference model.
   */
  computeLogprobs(argument: _streambp_v1_ComputeLogprobsRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_ComputeLogprobsResponse__Output>): grpc.ClientUnaryCall;
  computeLogprobs(argument: _streambp_v1_ComputeLogprobsRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_ComputeLogprobsResponse__Output>): grpc.ClientUnaryCall;
  computeLogprobs(argument: _streambp_v1_ComputeLogprobsRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_ComputeLogprobsResponse__Output>): grpc.ClientUnaryCall;
  computeLogprobs(argument: _streambp_v1_ComputeLogprobsRequest, callback: grpc.requestCallback<_streambp_v1_ComputeLogprobsResponse__Output>): grpc.ClientUnaryCall;
  
  /**
   * --- Sessions ----------------------------------------------------------------------
   * A session is one trainable thing on the server's shared base model: a LoRA adapter
   * (or, where the config allows it, full fine-tuning of a copy of the base) with its own
   * optimizer, step, policy version, rollout queue, watchers and checkpoints. Every model
   * RPC names its session in its `session` field; a server without sessions configured
   * has one default session ("" = the whole model), so older clients work unchanged.
   */
  CreateSession(argument: _streambp_v1_CreateSessionRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SessionInfo__Output>): grpc.ClientUnaryCall;
  CreateSession(argument: _streambp_v1_CreateSessionRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_SessionInfo__Output>): grpc.ClientUnaryCall;
  CreateSession(argument: _streambp_v1_CreateSessionRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SessionInfo__Output>): grpc.ClientUnaryCall;
  CreateSession(argument: _streambp_v1_CreateSessionRequest, callback: grpc.requestCallback<_streambp_v1_SessionInfo__Output>): grpc.ClientUnaryCall;
  /**
   * --- Sessions ----------------------------------------------------------------------
   * A session is one trainable thing on the server's shared base model: a LoRA adapter
   * (or, where the config allows it, full fine-tuning of a copy of the base) with its own
   * optimizer, step, policy version, rollout queue, watchers and checkpoints. Every model
   * RPC names its session in its `session` field; a server without sessions configured
   * has one default session ("" = the whole model), so older clients work unchanged.
   */
  createSession(argument: _streambp_v1_CreateSessionRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SessionInfo__Output>): grpc.ClientUnaryCall;
  createSession(argument: _streambp_v1_CreateSessionRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_SessionInfo__Output>): grpc.ClientUnaryCall;
  createSession(argument: _streambp_v1_CreateSessionRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SessionInfo__Output>): grpc.ClientUnaryCall;
  createSession(argument: _streambp_v1_CreateSessionRequest, callback: grpc.requestCallback<_streambp_v1_SessionInfo__Output>): grpc.ClientUnaryCall;
  
  /**
   * Removes the session, its state on disk and its queued rollouts (not its checkpoints).
   */
  DeleteSession(argument: _streambp_v1_DeleteSessionRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_DeleteSessionResponse__Output>): grpc.ClientUnaryCall;
  DeleteSession(argument: _streambp_v1_DeleteSessionRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_DeleteSessionResponse__Output>): grpc.ClientUnaryCall;
  DeleteSession(argument: _streambp_v1_DeleteSessionRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_DeleteSessionResponse__Output>): grpc.ClientUnaryCall;
  DeleteSession(argument: _streambp_v1_DeleteSessionRequest, callback: grpc.requestCallback<_streambp_v1_DeleteSessionResponse__Output>): grpc.ClientUnaryCall;
  /**
   * Removes the session, its state on disk and its queued rollouts (not its checkpoints).
   */
  deleteSession(argument: _streambp_v1_DeleteSessionRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_DeleteSessionResponse__Output>): grpc.ClientUnaryCall;
  deleteSession(argument: _streambp_v1_DeleteSessionRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_DeleteSessionResponse__Output>): grpc.ClientUnaryCall;
  deleteSession(argument: _streambp_v1_DeleteSessionRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_DeleteSessionResponse__Output>): grpc.ClientUnaryCall;
  deleteSession(argument: _streambp_v1_DeleteSessionRequest, callback: grpc.requestCallback<_streambp_v1_DeleteSessionResponse__Output>): grpc.ClientUnaryCall;
  
  DeleteSnapshot(argument: _streambp_v1_DeleteSnapshotRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_DeleteSnapshotResponse__Output>): grpc.ClientUnaryCall;
  DeleteSnapshot(argument: _streambp_v1_DeleteSnapshotRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_DeleteSnapshotResponse__Output>): grpc.ClientUnaryCall;
  DeleteSnapshot(argument: _streambp_v1_DeleteSnapshotRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_DeleteSnapshotResponse__Output>): grpc.ClientUnaryCall;
  DeleteSnapshot(argument: _streambp_v1_DeleteSnapshotRequest, callback: grpc.requestCallback<_streambp_v1_DeleteSnapshotResponse__Output>): grpc.ClientUnaryCall;
  deleteSnapshot(argument: _streambp_v1_DeleteSnapshotRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_DeleteSnapshotResponse__Output>): grpc.ClientUnaryCall;
  deleteSnapshot(argument: _streambp_v1_DeleteSnapshotRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_DeleteSnapshotResponse__Output>): grpc.ClientUnaryCall;
  deleteSnapshot(argument: _streambp_v1_DeleteSnapshotRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_DeleteSnapshotResponse__Output>): grpc.ClientUnaryCall;
  deleteSnapshot(argument: _streambp_v1_DeleteSnapshotRequest, callback: grpc.requestCallback<_streambp_v1_DeleteSnapshotResponse__Output>): grpc.ClientUnaryCall;
  
  Detokenize(argument: _streambp_v1_DetokenizeRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_DetokenizeResponse__Output>): grpc.ClientUnaryCall;
  Detokenize(argument: _streambp_v1_DetokenizeRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_DetokenizeResponse__Output>): grpc.ClientUnaryCall;
  Detokenize(argument: _streambp_v1_DetokenizeRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_DetokenizeResponse__Output>): grpc.ClientUnaryCall;
  Detokenize(argument: _streambp_v1_DetokenizeRequest, callback: grpc.requestCallback<_streambp_v1_DetokenizeResponse__Output>): grpc.ClientUnaryCall;
  detokenize(argument: _streambp_v1_DetokenizeRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_DetokenizeResponse__Output>): grpc.ClientUnaryCall;
  detokenize(argument: _streambp_v1_DetokenizeRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_DetokenizeResponse__Output>): grpc.ClientUnaryCall;
  detokenize(argument: _streambp_v1_DetokenizeRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_DetokenizeResponse__Output>): grpc.ClientUnaryCall;
  detokenize(argument: _streambp_v1_DetokenizeRequest, callback: grpc.requestCallback<_streambp_v1_DetokenizeResponse__Output>): grpc.ClientUnaryCall;
  
  /**
   * Predicted peak memory of a step, and whether it fits the configured budget.
   */
  EstimateMemory(argument: _streambp_v1_EstimateMemoryRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_EstimateMemoryResponse__Output>): grpc.ClientUnaryCall;
  EstimateMemory(argument: _streambp_v1_EstimateMemoryRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_EstimateMemoryResponse__Output>): grpc.ClientUnaryCall;
  EstimateMemory(argument: _streambp_v1_EstimateMemoryRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_EstimateMemoryResponse__Output>): grpc.ClientUnaryCall;
  EstimateMemory(argument: _streambp_v1_EstimateMemoryRequest, callback: grpc.requestCallback<_streambp_v1_EstimateMemoryResponse__Output>): grpc.ClientUnaryCall;
  /**
   * Predicted peak memory of a step, and whether it fits the configured budget.
   */
  estimateMemory(argument: _streambp_v1_EstimateMemoryRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_EstimateMemoryResponse__Output>): grpc.ClientUnaryCall;
  estimateMemory(argument: _streambp_v1_EstimateMemoryRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_EstimateMemoryResponse__Output>): grpc.ClientUnaryCall;
  estimateMemory(argument: _streambp_v1_EstimateMemoryRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_EstimateMemoryResponse__Output>): grpc.ClientUnaryCall;
  estimateMemory(argument: _streambp_v1_EstimateMemoryRequest, callback: grpc.requestCallback<_streambp_v1_EstimateMemoryResponse__Output>): grpc.ClientUnaryCall;
  
  /**
   * The current weights as a safetensors file (HF tensor names), streamed in pieces.
   */
  ExportWeights(argument: _streambp_v1_ExportWeightsRequest, metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientReadableStream<_streambp_v1_WeightsChunk__Output>;
  ExportWeights(argument: _streambp_v1_ExportWeightsRequest, options?: grpc.CallOptions): grpc.ClientReadableStream<_streambp_v1_WeightsChunk__Output>;
  /**
   * The current weights as a safetensors file (HF tensor names), streamed in pieces.
   */
  exportWeights(argument: _streambp_v1_ExportWeightsRequest, metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientReadableStream<_streambp_v1_WeightsChunk__Output>;
  exportWeights(argument: _streambp_v1_ExportWeightsRequest, options?: grpc.CallOptions): grpc.ClientReadableStream<_streambp_v1_WeightsChunk__Output>;
  
  /**
   * Forward and backward of a batch; gradients accumulate until OptimStep.
   */
  ForwardBackward(argument: _streambp_v1_ForwardBackwardRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_ForwardBackwardResponse__Output>): grpc.ClientUnaryCall;
  ForwardBackward(argument: _streambp_v1_ForwardBackwardRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_ForwardBackwardResponse__Output>): grpc.ClientUnaryCall;
  ForwardBackward(argument: _streambp_v1_ForwardBackwardRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_ForwardBackwardResponse__Output>): grpc.ClientUnaryCall;
  ForwardBackward(argument: _streambp_v1_ForwardBackwardRequest, callback: grpc.requestCallback<_streambp_v1_ForwardBackwardResponse__Output>): grpc.ClientUnaryCall;
  /**
   * Forward and backward of a batch; gradients accumulate until OptimStep.
   */
  forwardBackward(argument: _streambp_v1_ForwardBackwardRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_ForwardBackwardResponse__Output>): grpc.ClientUnaryCall;
  forwardBackward(argument: _streambp_v1_ForwardBackwardRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_ForwardBackwardResponse__Output>): grpc.ClientUnaryCall;
  forwardBackward(argument: _streambp_v1_ForwardBackwardRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_ForwardBackwardResponse__Output>): grpc.ClientUnaryCall;
  forwardBackward(argument: _streambp_v1_ForwardBackwardRequest, callback: grpc.requestCallback<_streambp_v1_ForwardBackwardResponse__Output>): grpc.ClientUnaryCall;
  
  /**
   * ForwardBackward with progress: queued (position), started, layer by layer, done
   * (the last message carries the response). Same semantics and request ids.
   */
  ForwardBackwardProgress(argument: _streambp_v1_ForwardBackwardRequest, metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientReadableStream<_streambp_v1_StepProgress__Output>;
  ForwardBackwardProgress(argument: _streambp_v1_ForwardBackwardRequest, options?: grpc.CallOptions): grpc.ClientReadableStream<_streambp_v1_StepProgress__Output>;
  /**
   * ForwardBackward with progress: queued (position), started, layer by layer, done
   * (the last message carries the response). Same semantics and request ids.
   */
  forwardBackwardProgress(argument: _streambp_v1_ForwardBackwardRequest, metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientReadableStream<_streambp_v1_StepProgress__Output>;
  forwardBackwardProgress(argument: _streambp_v1_ForwardBackwardRequest, options?: grpc.CallOptions): grpc.ClientReadableStream<_streambp_v1_StepProgress__Output>;
  
  /**
   * The session's training history: one record per optimizer step (TrainStep, OptimStep
   * after ForwardBackward, or a rollout step), oldest first. Page with after_index; the
   * same records are appended to <checkpoint_dir>[/<session>]/metrics.jsonl.
   */
  GetHistory(argument: _streambp_v1_GetHistoryRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_GetHistoryResponse__Output>): grpc.ClientUnaryCall;
  GetHistory(argument: _streambp_v1_GetHistoryRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_GetHistoryResponse__Output>): grpc.ClientUnaryCall;
  GetHistory(argument: _streambp_v1_GetHistoryRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_GetHistoryResponse__Output>): grpc.ClientUnaryCall;
  GetHistory(argument: _streambp_v1_GetHistoryRequest, callback: grpc.requestCallback<_streambp_v1_GetHistoryResponse__Output>): grpc.ClientUnaryCall;
  /**
   * The session's training history: one record per optimizer step (TrainStep, OptimStep
   * after ForwardBackward, or a rollout step), oldest first. Page with after_index; the
   * same records are appended to <checkpoint_dir>[/<session>]/metrics.jsonl.
   */
  getHistory(argument: _streambp_v1_GetHistoryRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_GetHistoryResponse__Output>): grpc.ClientUnaryCall;
  getHistory(argument: _streambp_v1_GetHistoryRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_GetHistoryResponse__Output>): grpc.ClientUnaryCall;
  getHistory(argument: _streambp_v1_GetHistoryRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_GetHistoryResponse__Output>): grpc.ClientUnaryCall;
  getHistory(argument: _streambp_v1_GetHistoryRequest, callback: grpc.requestCallback<_streambp_v1_GetHistoryResponse__Output>): grpc.ClientUnaryCall;
  
  /**
   * What the server runs: model, dtype, device, engine, chunk sizes, policy version.
   */
  GetInfo(argument: _streambp_v1_GetInfoRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_GetInfoResponse__Output>): grpc.ClientUnaryCall;
  GetInfo(argument: _streambp_v1_GetInfoRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_GetInfoResponse__Output>): grpc.ClientUnaryCall;
  GetInfo(argument: _streambp_v1_GetInfoRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_GetInfoResponse__Output>): grpc.ClientUnaryCall;
  GetInfo(argument: _streambp_v1_GetInfoRequest, callback: grpc.requestCallback<_streambp_v1_GetInfoResponse__Output>): grpc.ClientUnaryCall;
  /**
   * What the server runs: model, dtype, device, engine, chunk sizes, policy version.
   */
  getInfo(argument: _streambp_v1_GetInfoRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_GetInfoResponse__Output>): grpc.ClientUnaryCall;
  getInfo(argument: _streambp_v1_GetInfoRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_GetInfoResponse__Output>): grpc.ClientUnaryCall;
  getInfo(argument: _streambp_v1_GetInfoRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_GetInfoResponse__Output>): grpc.ClientUnaryCall;
  getInfo(argument: _streambp_v1_GetInfoRequest, callback: grpc.requestCallback<_streambp_v1_GetInfoResponse__Output>): grpc.ClientUnaryCall;
  
  /**
   * Counters of the rollout queue.
   */
  GetRolloutStats(argument: _streambp_v1_GetRolloutStatsRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_RolloutStats__Output>): grpc.ClientUnaryCall;
  GetRolloutStats(argument: _streambp_v1_GetRolloutStatsRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_RolloutStats__Output>): grpc.ClientUnaryCall;
  GetRolloutStats(argument: _streambp_v1_GetRolloutStatsRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_RolloutStats__Output>): grpc.ClientUnaryCall;
  GetRolloutStats(argument: _streambp_v1_GetRolloutStatsRequest, callback: grpc.requestCallback<_streambp_v1_RolloutStats__Output>): grpc.ClientUnaryCall;
  /**
   * Counters of the rollout queue.
   */
  getRolloutStats(argument: _streambp_v1_GetRolloutStatsRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_RolloutStats__Output>): grpc.ClientUnaryCall;
  getRolloutStats(argument: _streambp_v1_GetRolloutStatsRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_RolloutStats__Output>): grpc.ClientUnaryCall;
  getRolloutStats(argument: _streambp_v1_GetRolloutStatsRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_RolloutStats__Output>): grpc.ClientUnaryCall;
  getRolloutStats(argument: _streambp_v1_GetRolloutStatsRequest, callback: grpc.requestCallback<_streambp_v1_RolloutStats__Output>): grpc.ClientUnaryCall;
  
  GetSession(argument: _streambp_v1_GetSessionRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SessionInfo__Output>): grpc.ClientUnaryCall;
  GetSession(argument: _streambp_v1_GetSessionRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_SessionInfo__Output>): grpc.ClientUnaryCall;
  GetSession(argument: _streambp_v1_GetSessionRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SessionInfo__Output>): grpc.ClientUnaryCall;
  GetSession(argument: _streambp_v1_GetSessionRequest, callback: grpc.requestCallback<_streambp_v1_SessionInfo__Output>): grpc.ClientUnaryCall;
  getSession(argument: _streambp_v1_GetSessionRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SessionInfo__Output>): grpc.ClientUnaryCall;
  getSession(argument: _streambp_v1_GetSessionRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_SessionInfo__Output>): grpc.ClientUnaryCall;
  getSession(argument: _streambp_v1_GetSessionRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SessionInfo__Output>): grpc.ClientUnaryCall;
  getSession(argument: _streambp_v1_GetSessionRequest, callback: grpc.requestCallback<_streambp_v1_SessionInfo__Output>): grpc.ClientUnaryCall;
  
  ListSessions(argument: _streambp_v1_ListSessionsRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_ListSessionsResponse__Output>): grpc.ClientUnaryCall;
  ListSessions(argument: _streambp_v1_ListSessionsRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_ListSessionsResponse__Output>): grpc.ClientUnaryCall;
  ListSessions(argument: _streambp_v1_ListSessionsRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_ListSessionsResponse__Output>): grpc.ClientUnaryCall;
  ListSessions(argument: _streambp_v1_ListSessionsRequest, callback: grpc.requestCallback<_streambp_v1_ListSessionsResponse__Output>): grpc.ClientUnaryCall;
  listSessions(argument: _streambp_v1_ListSessionsRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_ListSessionsResponse__Output>): grpc.ClientUnaryCall;
  listSessions(argument: _streambp_v1_ListSessionsRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_ListSessionsResponse__Output>): grpc.ClientUnaryCall;
  listSessions(argument: _streambp_v1_ListSessionsRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_ListSessionsResponse__Output>): grpc.ClientUnaryCall;
  listSessions(argument: _streambp_v1_ListSessionsRequest, callback: grpc.requestCallback<_streambp_v1_ListSessionsResponse__Output>): grpc.ClientUnaryCall;
  
  ListSnapshots(argument: _streambp_v1_ListSnapshotsRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_ListSnapshotsResponse__Output>): grpc.ClientUnaryCall;
  ListSnapshots(argument: _streambp_v1_ListSnapshotsRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_ListSnapshotsResponse__Output>): grpc.ClientUnaryCall;
  ListSnapshots(argument: _streambp_v1_ListSnapshotsRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_ListSnapshotsResponse__Output>): grpc.ClientUnaryCall;
  ListSnapshots(argument: _streambp_v1_ListSnapshotsRequest, callback: grpc.requestCallback<_streambp_v1_ListSnapshotsResponse__Output>): grpc.ClientUnaryCall;
  listSnapshots(argument: _streambp_v1_ListSnapshotsRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_ListSnapshotsResponse__Output>): grpc.ClientUnaryCall;
  listSnapshots(argument: _streambp_v1_ListSnapshotsRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_ListSnapshotsResponse__Output>): grpc.ClientUnaryCall;
  listSnapshots(argument: _streambp_v1_ListSnapshotsRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_ListSnapshotsResponse__Output>): grpc.ClientUnaryCall;
  listSnapshots(argument: _streambp_v1_ListSnapshotsRequest, callback: grpc.requestCallback<_streambp_v1_ListSnapshotsResponse__Output>): grpc.ClientUnaryCall;
  
  LoadCheckpoint(argument: _streambp_v1_LoadCheckpointRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_LoadCheckpointResponse__Output>): grpc.ClientUnaryCall;
  LoadCheckpoint(argument: _streambp_v1_LoadCheckpointRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_LoadCheckpointResponse__Output>): grpc.ClientUnaryCall;
  LoadCheckpoint(argument: _streambp_v1_LoadCheckpointRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_LoadCheckpointResponse__Output>): grpc.ClientUnaryCall;
  LoadCheckpoint(argument: _streambp_v1_LoadCheckpointRequest, callback: grpc.requestCallback<_streambp_v1_LoadCheckpointResponse__Output>): grpc.ClientUnaryCall;
  loadCheckpoint(argument: _streambp_v1_LoadCheckpointRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_LoadCheckpointResponse__Output>): grpc.ClientUnaryCall;
  loadCheckpoint(argument: _streambp_v1_LoadCheckpointRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_LoadCheckpointResponse__Output>): grpc.ClientUnaryCall;
  loadCheckpoint(argument: _streambp_v1_LoadCheckpointRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_LoadCheckpointResponse__Output>): grpc.ClientUnaryCall;
  loadCheckpoint(argument: _streambp_v1_LoadCheckpointRequest, callback: grpc.requestCallback<_streambp_v1_LoadCheckpointResponse__Output>): grpc.ClientUnaryCall;
  
  /**
   * Applies the accumulated gradients (AdamW or SGD, clipping, LR schedule).
   */
  OptimStep(argument: _streambp_v1_OptimStepRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_OptimStepResponse__Output>): grpc.ClientUnaryCall;
  OptimStep(argument: _streambp_v1_OptimStepRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_OptimStepResponse__Output>): grpc.ClientUnaryCall;
  OptimStep(argument: _streambp_v1_OptimStepRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_OptimStepResponse__Output>): grpc.ClientUnaryCall;
  OptimStep(argument: _streambp_v1_OptimStepRequest, callback: grpc.requestCallback<_streambp_v1_OptimStepResponse__Output>): grpc.ClientUnaryCall;
  /**
   * Applies the accumulated gradients (AdamW or SGD, clipping, LR schedule).
   */
  optimStep(argument: _streambp_v1_OptimStepRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_OptimStepResponse__Output>): grpc.ClientUnaryCall;
  optimStep(argument: _streambp_v1_OptimStepRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_OptimStepResponse__Output>): grpc.ClientUnaryCall;
  optimStep(argument: _streambp_v1_OptimStepRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_OptimStepResponse__Output>): grpc.ClientUnaryCall;
  optimStep(argument: _streambp_v1_OptimStepRequest, callback: grpc.requestCallback<_streambp_v1_OptimStepResponse__Output>): grpc.ClientUnaryCall;
  
  /**
   * Rollout groups for server-side GRPO steps. Each group is acknowledged once it is
   * durably queued (appended and fsynced to the rollout log when one is configured);
   * when rollouts.groups_per_step groups are queued the server runs a step by itself.
   */
  PushRollouts(argument: _streambp_v1_PushRolloutsRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_PushRolloutsResponse__Output>): grpc.ClientUnaryCall;
  PushRollouts(argument: _streambp_v1_PushRolloutsRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_PushRolloutsResponse__Output>): grpc.ClientUnaryCall;
  PushRollouts(argument: _streambp_v1_PushRolloutsRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_PushRolloutsResponse__Output>): grpc.ClientUnaryCall;
  PushRollouts(argument: _streambp_v1_PushRolloutsRequest, callback: grpc.requestCallback<_streambp_v1_PushRolloutsResponse__Output>): grpc.ClientUnaryCall;
  /**
   * Rollout groups for server-side GRPO steps. Each group is acknowledged once it is
   * durably queued (appended and fsynced to the rollout log when one is configured);
   * when rollouts.groups_per_step groups are queued the server runs a step by itself.
   */
  pushRollouts(argument: _streambp_v1_PushRolloutsRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_PushRolloutsResponse__Output>): grpc.ClientUnaryCall;
  pushRollouts(argument: _streambp_v1_PushRolloutsRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_PushRolloutsResponse__Output>): grpc.ClientUnaryCall;
  pushRollouts(argument: _streambp_v1_PushRolloutsRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_PushRolloutsResponse__Output>): grpc.ClientUnaryCall;
  pushRollouts(argument: _streambp_v1_PushRolloutsRequest, callback: grpc.requestCallback<_streambp_v1_PushRolloutsResponse__Output>): grpc.ClientUnaryCall;
  
  /**
   * The same as a stream: one ack per pushed group, in order.
   */
  PushRolloutsStream(metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientDuplexStream<_streambp_v1_RolloutGroup, _streambp_v1_RolloutAck__Output>;
  PushRolloutsStream(options?: grpc.CallOptions): grpc.ClientDuplexStream<_streambp_v1_RolloutGroup, _streambp_v1_RolloutAck__Output>;
  /**
   * The same as a stream: one ack per pushed group, in order.
   */
  pushRolloutsStream(metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientDuplexStream<_streambp_v1_RolloutGroup, _streambp_v1_RolloutAck__Output>;
  pushRolloutsStream(options?: grpc.CallOptions): grpc.ClientDuplexStream<_streambp_v1_RolloutGroup, _streambp_v1_RolloutAck__Output>;
  
  /**
   * --- The RL loop -----------------------------------------------------------------
   * Completions of prompts from the current policy, with per-token log-probs and the
   * policy version that produced them (KV-cached generation, batched across prompts).
   */
  Sample(argument: _streambp_v1_SampleRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SampleResponse__Output>): grpc.ClientUnaryCall;
  Sample(argument: _streambp_v1_SampleRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_SampleResponse__Output>): grpc.ClientUnaryCall;
  Sample(argument: _streambp_v1_SampleRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SampleResponse__Output>): grpc.ClientUnaryCall;
  Sample(argument: _streambp_v1_SampleRequest, callback: grpc.requestCallback<_streambp_v1_SampleResponse__Output>): grpc.ClientUnaryCall;
  /**
   * --- The RL loop -----------------------------------------------------------------
   * Completions of prompts from the current policy, with per-token log-probs and the
   * policy version that produced them (KV-cached generation, batched across prompts).
   */
  sample(argument: _streambp_v1_SampleRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SampleResponse__Output>): grpc.ClientUnaryCall;
  sample(argument: _streambp_v1_SampleRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_SampleResponse__Output>): grpc.ClientUnaryCall;
  sample(argument: _streambp_v1_SampleRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SampleResponse__Output>): grpc.ClientUnaryCall;
  sample(argument: _streambp_v1_SampleRequest, callback: grpc.requestCallback<_streambp_v1_SampleResponse__Output>): grpc.ClientUnaryCall;
  
  /**
   * Full resumable state into the configured checkpoint directory, under a name.
   */
  SaveCheckpoint(argument: _streambp_v1_SaveCheckpointRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SaveCheckpointResponse__Output>): grpc.ClientUnaryCall;
  SaveCheckpoint(argument: _streambp_v1_SaveCheckpointRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_SaveCheckpointResponse__Output>): grpc.ClientUnaryCall;
  SaveCheckpoint(argument: _streambp_v1_SaveCheckpointRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SaveCheckpointResponse__Output>): grpc.ClientUnaryCall;
  SaveCheckpoint(argument: _streambp_v1_SaveCheckpointRequest, callback: grpc.requestCallback<_streambp_v1_SaveCheckpointResponse__Output>): grpc.ClientUnaryCall;
  /**
   * Full resumable state into the configured checkpoint directory, under a name.
   */
  saveCheckpoint(argument: _streambp_v1_SaveCheckpointRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SaveCheckpointResponse__Output>): grpc.ClientUnaryCall;
  saveCheckpoint(argument: _streambp_v1_SaveCheckpointRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_SaveCheckpointResponse__Output>): grpc.ClientUnaryCall;
  saveCheckpoint(argument: _streambp_v1_SaveCheckpointRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SaveCheckpointResponse__Output>): grpc.ClientUnaryCall;
  saveCheckpoint(argument: _streambp_v1_SaveCheckpointRequest, callback: grpc.requestCallback<_streambp_v1_SaveCheckpointResponse__Output>): grpc.ClientUnaryCall;
  
  /**
   * --- Sampler snapshots ---------------------------------------------------------------
   * A session's weights frozen under a name (a LoRA session's adapter: megabytes), which
   * Sample, ComputeLogprobs and ExportWeights target through their `snapshot` field while the
   * session trains on (Tinker's save_weights_for_sampler). Bounded per session
   * (sessions.max_snapshots and sessions.max_snapshot_bytes), kept on disk in the session's
   * state folder and read into device memory when used (like sessions), and removed by
   * DeleteSnapshot, after their TTL, or with their session. Servers with sessions only.
   */
  SaveWeightsForSampler(argument: _streambp_v1_SaveWeightsForSamplerRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SnapshotInfo__Output>): grpc.ClientUnaryCall;
  SaveWeightsForSampler(argument: _streambp_v1_SaveWeightsForSamplerRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_SnapshotInfo__Output>): grpc.ClientUnaryCall;
  SaveWeightsForSampler(argument: _streambp_v1_SaveWeightsForSamplerRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SnapshotInfo__Output>): grpc.ClientUnaryCall;
  SaveWeightsForSampler(argument: _streambp_v1_SaveWeightsForSamplerRequest, callback: grpc.requestCallback<_streambp_v1_SnapshotInfo__Output>): grpc.ClientUnaryCall;
  /**
   * --- Sampler snapshots ---------------------------------------------------------------
   * A session's weights frozen under a name (a LoRA session's adapter: megabytes), which
   * Sample, ComputeLogprobs and ExportWeights target through their `snapshot` field while the
   * session trains on (Tinker's save_weights_for_sampler). Bounded per session
   * (sessions.max_snapshots and sessions.max_snapshot_bytes), kept on disk in the session's
   * state folder and read into device memory when used (like sessions), and removed by
   * DeleteSnapshot, after their TTL, or with their session. Servers with sessions only.
   */
  saveWeightsForSampler(argument: _streambp_v1_SaveWeightsForSamplerRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SnapshotInfo__Output>): grpc.ClientUnaryCall;
  saveWeightsForSampler(argument: _streambp_v1_SaveWeightsForSamplerRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_SnapshotInfo__Output>): grpc.ClientUnaryCall;
  saveWeightsForSampler(argument: _streambp_v1_SaveWeightsForSamplerRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_SnapshotInfo__Output>): grpc.ClientUnaryCall;
  saveWeightsForSampler(argument: _streambp_v1_SaveWeightsForSamplerRequest, callback: grpc.requestCallback<_streambp_v1_SnapshotInfo__Output>): grpc.ClientUnaryCall;
  
  /**
   * --- Text ----------------------------------------------------------------------------
   * The model folder's tokenizer and chat format (GetInfo.tokenizer): text or messages to
   * ids (with the loss mask of assistant turns), and ids back to text. A model without a
   * tokenizer answers FAILED_PRECONDITION; token ids work everywhere regardless.
   */
  Tokenize(argument: _streambp_v1_TokenizeRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_TokenizeResponse__Output>): grpc.ClientUnaryCall;
  Tokenize(argument: _streambp_v1_TokenizeRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_TokenizeResponse__Output>): grpc.ClientUnaryCall;
  Tokenize(argument: _streambp_v1_TokenizeRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_TokenizeResponse__Output>): grpc.ClientUnaryCall;
  Tokenize(argument: _streambp_v1_TokenizeRequest, callback: grpc.requestCallback<_streambp_v1_TokenizeResponse__Output>): grpc.ClientUnaryCall;
  /**
   * --- Text ----------------------------------------------------------------------------
   * The model folder's tokenizer and chat format (GetInfo.tokenizer): text or messages to
   * ids (with the loss mask of assistant turns), and ids back to text. A model without a
   * tokenizer answers FAILED_PRECONDITION; token ids work everywhere regardless.
   */
  tokenize(argument: _streambp_v1_TokenizeRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_TokenizeResponse__Output>): grpc.ClientUnaryCall;
  tokenize(argument: _streambp_v1_TokenizeRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_TokenizeResponse__Output>): grpc.ClientUnaryCall;
  tokenize(argument: _streambp_v1_TokenizeRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_TokenizeResponse__Output>): grpc.ClientUnaryCall;
  tokenize(argument: _streambp_v1_TokenizeRequest, callback: grpc.requestCallback<_streambp_v1_TokenizeResponse__Output>): grpc.ClientUnaryCall;
  
  /**
   * ForwardBackward + OptimStep in one call: the usual path.
   */
  TrainStep(argument: _streambp_v1_TrainStepRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_TrainStepResponse__Output>): grpc.ClientUnaryCall;
  TrainStep(argument: _streambp_v1_TrainStepRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_TrainStepResponse__Output>): grpc.ClientUnaryCall;
  TrainStep(argument: _streambp_v1_TrainStepRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_TrainStepResponse__Output>): grpc.ClientUnaryCall;
  TrainStep(argument: _streambp_v1_TrainStepRequest, callback: grpc.requestCallback<_streambp_v1_TrainStepResponse__Output>): grpc.ClientUnaryCall;
  /**
   * ForwardBackward + OptimStep in one call: the usual path.
   */
  trainStep(argument: _streambp_v1_TrainStepRequest, metadata: grpc.Metadata, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_TrainStepResponse__Output>): grpc.ClientUnaryCall;
  trainStep(argument: _streambp_v1_TrainStepRequest, metadata: grpc.Metadata, callback: grpc.requestCallback<_streambp_v1_TrainStepResponse__Output>): grpc.ClientUnaryCall;
  trainStep(argument: _streambp_v1_TrainStepRequest, options: grpc.CallOptions, callback: grpc.requestCallback<_streambp_v1_TrainStepResponse__Output>): grpc.ClientUnaryCall;
  trainStep(argument: _streambp_v1_TrainStepRequest, callback: grpc.requestCallback<_streambp_v1_TrainStepResponse__Output>): grpc.ClientUnaryCall;
  
  /**
   * TrainStep with progress (see ForwardBackwardProgress).
   */
  TrainStepProgress(argument: _streambp_v1_TrainStepRequest, metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientReadableStream<_streambp_v1_StepProgress__Output>;
  TrainStepProgress(argument: _streambp_v1_TrainStepRequest, options?: grpc.CallOptions): grpc.ClientReadableStream<_streambp_v1_StepProgress__Output>;
  /**
   * TrainStep with progress (see ForwardBackwardProgress).
   */
  trainStepProgress(argument: _streambp_v1_TrainStepRequest, metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientReadableStream<_streambp_v1_StepProgress__Output>;
  trainStepProgress(argument: _streambp_v1_TrainStepRequest, options?: grpc.CallOptions): grpc.ClientReadableStream<_streambp_v1_StepProgress__Output>;
  
  /**
   * One message per new policy version from since_version on (the current one first).
   */
  WatchPolicy(argument: _streambp_v1_WatchPolicyRequest, metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientReadableStream<_streambp_v1_PolicyUpdate__Output>;
  WatchPolicy(argument: _streambp_v1_WatchPolicyRequest, options?: grpc.CallOptions): grpc.ClientReadableStream<_streambp_v1_PolicyUpdate__Output>;
  /**
   * One message per new policy version from since_version on (the current one first).
   */
  watchPolicy(argument: _streambp_v1_WatchPolicyRequest, metadata: grpc.Metadata, options?: grpc.CallOptions): grpc.ClientReadableStream<_streambp_v1_PolicyUpdate__Output>;
  watchPolicy(argument: _streambp_v1_WatchPolicyRequest, options?: grpc.CallOptions): grpc.ClientReadableStream<_streambp_v1_PolicyUpdate__Output>;
  
}

export interface TrainerHandlers extends grpc.UntypedServiceImplementation {
  /**
   * Per-token log-probs of sequences under the policy or the frozen reference model.
   */
  ComputeLogprobs: grpc.handleUnaryCall<_streambp_v1_ComputeLogprobsRequest__Output, _streambp_v1_ComputeLogprobsResponse>;
  
  /**
   * --- Sessions ----------------------------------------------------------------------
   * A session is one trainable thing on the server's shared base model: a LoRA adapter
   * (or, where the config allows it, full fine-tuning of a copy of the base) with its own
   * optimizer, step, policy version, rollout queue, watchers and checkpoints. Every model
   * RPC names its session in its `session` field; a server without sessions configured
   * has one default session ("" = the whole model), so older clients work unchanged.
   */
  CreateSession: grpc.handleUnaryCall<_streambp_v1_CreateSessionRequest__Output, _streambp_v1_SessionInfo>;
  
  /**
   * Removes the session, its state on disk and its queued rollouts (not its checkpoints).
   */
  DeleteSession: grpc.handleUnaryCall<_streambp_v1_DeleteSessionRequest__Output, _streambp_v1_DeleteSessionResponse>;
  
  DeleteSnapshot: grpc.handleUnaryCall<_streambp_v1_DeleteSnapshotRequest__Output, _streambp_v1_DeleteSnapshotResponse>;
  
  Detokenize: grpc.handleUnaryCall<_streambp_v1_DetokenizeRequest__Output, _streambp_v1_DetokenizeResponse>;
  
  /**
   * Predicted peak memory of a step, and whether it fits the configured budget.
   */
  EstimateMemory: grpc.handleUnaryCall<_streambp_v1_EstimateMemoryRequest__Output, _streambp_v1_EstimateMemoryResponse>;
  
  /**
   * The current weights as a safetensors file (HF tensor names), streamed in pieces.
   */
  ExportWeights: grpc.handleServerStreamingCall<_streambp_v1_ExportWeightsRequest__Output, _streambp_v1_WeightsChunk>;
  
  /**
   * Forward and backward of a batch; gradients accumulate until OptimStep.
   */
  ForwardBackward: grpc.handleUnaryCall<_streambp_v1_ForwardBackwardRequest__Output, _streambp_v1_ForwardBackwardResponse>;
  
  /**
   * ForwardBackward with progress: queued (position), started, layer by layer, done
   * (the last message carries the response). Same semantics and request ids.
   */
  ForwardBackwardProgress: grpc.handleServerStreamingCall<_streambp_v1_ForwardBackwardRequest__Output, _streambp_v1_StepProgress>;
  
  /**
   * The session's training history: one record per optimizer step (TrainStep, OptimStep
   * after ForwardBackward, or a rollout step), oldest first. Page with after_index; the
   * same records are appended to <checkpoint_dir>[/<session>]/metrics.jsonl.
   */
  GetHistory: grpc.handleUnaryCall<_streambp_v1_GetHistoryRequest__Output, _streambp_v1_GetHistoryResponse>;
  
  /**
   * What the server runs: model, dtype, device, engine, chunk sizes, policy version.
   */
  GetInfo: grpc.handleUnaryCall<_streambp_v1_GetInfoRequest__Output, _streambp_v1_GetInfoResponse>;
  
  /**
   * Counters of the rollout queue.
   */
  GetRolloutStats: grpc.handleUnaryCall<_streambp_v1_GetRolloutStatsRequest__Output, _streambp_v1_RolloutStats>;
  
  GetSession: grpc.handleUnaryCall<_streambp_v1_GetSessionRequest__Output, _streambp_v1_SessionInfo>;
  
  ListSessions: grpc.handleUnaryCall<_streambp_v1_ListSessionsRequest__Output, _streambp_v1_ListSessionsResponse>;
  
  ListSnapshots: grpc.handleUnaryCall<_streambp_v1_ListSnapshotsRequest__Output, _streambp_v1_ListSnapshotsResponse>;
  
  LoadCheckpoint: grpc.handleUnaryCall<_streambp_v1_LoadCheckpointRequest__Output, _streambp_v1_LoadCheckpointResponse>;
  
  /**
   * Applies the accumulated gradients (AdamW or SGD, clipping, LR schedule).
   */
  OptimStep: grpc.handleUnaryCall<_streambp_v1_OptimStepRequest__Output, _streambp_v1_OptimStepResponse>;
  
  /**
   * Rollout groups for server-side GRPO steps. Each group is acknowledged once it is
   * durably queued (appended and fsynced to the rollout log when one is configured);
   * when rollouts.groups_per_step groups are queued the server runs a step by itself.
   */
  PushRollouts: grpc.handleUnaryCall<_streambp_v1_PushRolloutsRequest__Output, _streambp_v1_PushRolloutsResponse>;
  
  /**
   * The same as a stream: one ack per pushed group, in order.
   */
  PushRolloutsStream: grpc.handleBidiStreamingCall<_streambp_v1_RolloutGroup__Output, _streambp_v1_RolloutAck>;
  
  /**
   * --- The RL loop -----------------------------------------------------------------
   * Completions of prompts from the current policy, with per-token log-probs and the
   * policy version that produced them (KV-cached generation, batched across prompts).
   */
  Sample: grpc.handleUnaryCall<_streambp_v1_SampleRequest__Output, _streambp_v1_SampleResponse>;
  
  /**
   * Full resumable state into the configured checkpoint directory, under a name.
   */
  SaveCheckpoint: grpc.handleUnaryCall<_streambp_v1_SaveCheckpointRequest__Output, _streambp_v1_SaveCheckpointResponse>;
  
  /**
   * --- Sampler snapshots ---------------------------------------------------------------
   * A session's weights frozen under a name (a LoRA session's adapter: megabytes), which
   * Sample, ComputeLogprobs and ExportWeights target through their `snapshot` field while the
   * session trains on (Tinker's save_weights_for_sampler). Bounded per session
   * (sessions.max_snapshots and sessions.max_snapshot_bytes), kept on disk in the session's
   * state folder and read into device memory when used (like sessions), and removed by
   * DeleteSnapshot, after their TTL, or with their session. Servers with sessions only.
   */
  SaveWeightsForSampler: grpc.handleUnaryCall<_streambp_v1_SaveWeightsForSamplerRequest__Output, _streambp_v1_SnapshotInfo>;
  
  /**
   * --- Text ----------------------------------------------------------------------------
   * The model folder's tokenizer and chat format (GetInfo.tokenizer): text or messages to
   * ids (with the loss mask of assistant turns), and ids back to text. A model without a
   * tokenizer answers FAILED_PRECONDITION; token ids work everywhere regardless.
   */
  Tokenize: grpc.handleUnaryCall<_streambp_v1_TokenizeRequest__Output, _streambp_v1_TokenizeResponse>;
  
  /**
   * ForwardBackward + OptimStep in one call: the usual path.
   */
  TrainStep: grpc.handleUnaryCall<_streambp_v1_TrainStepRequest__Output, _streambp_v1_TrainStepResponse>;
  
  /**
   * TrainStep with progress (see ForwardBackwardProgress).
   */
  TrainStepProgress: grpc.handleServerStreamingCall<_streambp_v1_TrainStepRequest__Output, _streambp_v1_StepProgress>;
  
  /**
   * One message per new policy version from since_version on (the current one first).
   */
  WatchPolicy: grpc.handleServerStreamingCall<_streambp_v1_WatchPolicyRequest__Output, _streambp_v1_PolicyUpdate>;
  
}

export interface TrainerDefinition extends grpc.ServiceDefinition {
  ComputeLogprobs: MethodDefinition<_streambp_v1_ComputeLogprobsRequest, _streambp_v1_ComputeLogprobsResponse, _streambp_v1_ComputeLogprobsRequest__Output, _streambp_v1_ComputeLogprobsResponse__Output>
  CreateSession: MethodDefinition<_streambp_v1_CreateSessionRequest, _streambp_v1_SessionInfo, _streambp_v1_CreateSessionRequest__Output, _streambp_v1_SessionInfo__Output>
  DeleteSession: MethodDefinition<_streambp_v1_DeleteSessionRequest, _streambp_v1_DeleteSessionResponse, _streambp_v1_DeleteSessionRequest__Output, _streambp_v1_DeleteSessionResponse__Output>
  DeleteSnapshot: MethodDefinition<_streambp_v1_DeleteSnapshotRequest, _streambp_v1_DeleteSnapshotResponse, _streambp_v1_DeleteSnapshotRequest__Output, _streambp_v1_DeleteSnapshotResponse__Output>
  Detokenize: MethodDefinition<_streambp_v1_DetokenizeRequest, _streambp_v1_DetokenizeResponse, _streambp_v1_DetokenizeRequest__Output, _streambp_v1_DetokenizeResponse__Output>
  EstimateMemory: MethodDefinition<_streambp_v1_EstimateMemoryRequest, _streambp_v1_EstimateMemoryResponse, _streambp_v1_EstimateMemoryRequest__Output, _streambp_v1_EstimateMemoryResponse__Output>
  ExportWeights: MethodDefinition<_streambp_v1_ExportWeightsRequest, _streambp_v1_WeightsChunk, _streambp_v1_ExportWeightsRequest__Output, _streambp_v1_WeightsChunk__Output>
  ForwardBackward: MethodDefinition<_streambp_v1_ForwardBackwardRequest, _streambp_v1_ForwardBackwardResponse, _streambp_v1_ForwardBackwardRequest__Output, _streambp_v1_ForwardBackwardResponse__Output>
  ForwardBackwardProgress: MethodDefinition<_streambp_v1_ForwardBackwardRequest, _streambp_v1_StepProgress, _streambp_v1_ForwardBackwardRequest__Output, _streambp_v1_StepProgress__Output>
  GetHistory: MethodDefinition<_streambp_v1_GetHistoryRequest, _streambp_v1_GetHistoryResponse, _streambp_v1_GetHistoryRequest__Output, _streambp_v1_GetHistoryResponse__Output>
  GetInfo: MethodDefinition<_streambp_v1_GetInfoRequest, _streambp_v1_GetInfoResponse, _streambp_v1_GetInfoRequest__Output, _streambp_v1_GetInfoResponse__Output>
  GetRolloutStats: MethodDefinition<_streambp_v1_GetRolloutStatsRequest, _streambp_v1_RolloutStats, _streambp_v1_GetRolloutStatsRequest__Output, _streambp_v1_RolloutStats__Output>
  GetSession: MethodDefinition<_streambp_v1_GetSessionRequest, _streambp_v1_SessionInfo, _streambp_v1_GetSessionRequest__Output, _streambp_v1_SessionInfo__Output>
  ListSessions: MethodDefinition<_streambp_v1_ListSessionsRequest, _streambp_v1_ListSessionsResponse, _streambp_v1_ListSessionsRequest__Output, _streambp_v1_ListSessionsResponse__Output>
  ListSnapshots: MethodDefinition<_streambp_v1_ListSnapshotsRequest, _streambp_v1_ListSnapshotsResponse, _streambp_v1_ListSnapshotsRequest__Output, _streambp_v1_ListSnapshotsResponse__Output>
  LoadCheckpoint: MethodDefinition<_streambp_v1_LoadCheckpointRequest, _streambp_v1_LoadCheckpointResponse, _streambp_v1_LoadCheckpointRequest__Output, _streambp_v1_LoadCheckpointResponse__Output>
  OptimStep: MethodDefinition<_streambp_v1_OptimStepRequest, _streambp_v1_OptimStepResponse, _streambp_v1_OptimStepRequest__Output, _streambp_v1_OptimStepResponse__Output>
  PushRollouts: MethodDefinition<_streambp_v1_PushRolloutsRequest, _streambp_v1_PushRolloutsResponse, _streambp_v1_PushRolloutsRequest__Output, _streambp_v1_PushRolloutsResponse__Output>
  PushRolloutsStream: MethodDefinition<_streambp_v1_RolloutGroup, _streambp_v1_RolloutAck, _streambp_v1_RolloutGroup__Output, _streambp_v1_RolloutAck__Output>
  Sample: MethodDefinition<_streambp_v1_SampleRequest, _streambp_v1_SampleResponse, _streambp_v1_SampleRequest__Output, _streambp_v1_SampleResponse__Output>
  SaveCheckpoint: MethodDefinition<_streambp_v1_SaveCheckpointRequest, _streambp_v1_SaveCheckpointResponse, _streambp_v1_SaveCheckpointRequest__Output, _streambp_v1_SaveCheckpointResponse__Output>
  SaveWeightsForSampler: MethodDefinition<_streambp_v1_SaveWeightsForSamplerRequest, _streambp_v1_SnapshotInfo, _streambp_v1_SaveWeightsForSamplerRequest__Output, _streambp_v1_SnapshotInfo__Output>
  Tokenize: MethodDefinition<_streambp_v1_TokenizeRequest, _streambp_v1_TokenizeResponse, _streambp_v1_TokenizeRequest__Output, _streambp_v1_TokenizeResponse__Output>
  TrainStep: MethodDefinition<_streambp_v1_TrainStepRequest, _streambp_v1_TrainStepResponse, _streambp_v1_TrainStepRequest__Output, _streambp_v1_TrainStepResponse__Output>
  TrainStepProgress: MethodDefinition<_streambp_v1_TrainStepRequest, _streambp_v1_StepProgress, _streambp_v1_TrainStepRequest__Output, _streambp_v1_StepProgress__Output>
  WatchPolicy: MethodDefinition<_streambp_v1_WatchPolicyRequest, _streambp_v1_PolicyUpdate, _streambp_v1_WatchPolicyRequest__Output, _streambp_v1_PolicyUpdate__Output>
}
