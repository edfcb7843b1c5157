import type * as grpc from '@grpc/grpc-js';
import type { MessageTypeDefinition } from '@grpc/proto-loader';

import type { AdamParams as _streambp_v1_AdamParams, AdamParams__Output as _streambp_v1_AdamParams__Output } from './streambp/v1/AdamParams';
import type { Batch as _streambp_v1_Batch, Batch__Output as _streambp_v1_Batch__Output } from './streambp/v1/Batch';
import type { ChatMessage as _streambp_v1_ChatMessage, ChatMessage__Output as _streambp_v1_ChatMessage__Output } from './streambp/v1/ChatMessage';
import type { Completion as _streambp_v1_Completion, Completion__Output as _streambp_v1_Completion__Output } from './streambp/v1/Completion';
import type { ComputeLogprobsRequest as _streambp_v1_ComputeLogprobsRequest, ComputeLogprobsRequest__Output as _streambp_v1_ComputeLogprobsRequest__Output } from './streambp/v1/ComputeLogprobsRequest';
import type { ComputeLogprobsResponse as _streambp_v1_ComputeLogprobsResponse, ComputeLogprobsResponse__Output as _streambp_v1_ComputeLogprobsResponse__Output } from './streambp/v1/ComputeLogprobsResponse';
import type { ConfigValue as _streambp_v1_ConfigValue, ConfigValue__Output as _streambp_v1_ConfigValue__Output } from './streambp/v1/ConfigValue';
import type { CreateSessionRequest as _streambp_v1_CreateSessionRequest, CreateSessionRequest__Output as _streambp_v1_CreateSessionRequest__Output } from './streambp/v1/CreateSessionRequest';
import type { Datum as _streambp_v1_Datum, Datum__Output as _streambp_v1_Datum__Output } from './streambp/v1/Datum';
import type { DatumBatch as _streambp_v1_DatumBatch, DatumBatch__Output as _streambp_v1_DatumBatch__Output } from './streambp/v1/DatumBatch';
import type { DeleteSessionRequest as _streambp_v1_DeleteSessionRequest, DeleteSessionRequest__Output as _streambp_v1_DeleteSessionRequest__Output } from './streambp/v1/DeleteSessionRequest';
import type { DeleteSessionResponse as _streambp_v1_DeleteSessionResponse, DeleteSessionResponse__Output as _streambp_v1_DeleteSessionResponse__Output } from './streambp/v1/DeleteSessionResponse';
import type { DeleteSnapshotRequest as _streambp_v1_DeleteSnapshotRequest, DeleteSnapshotRequest__Output as _streambp_v1_DeleteSnapshotRequest__Output } from './streambp/v1/DeleteSnapshotRequest';
import type { DeleteSnapshotResponse as _streambp_v1_DeleteSnapshotResponse, DeleteSnapshotResponse__Output as _streambp_v1_DeleteSnapshotResponse__Output } from './streambp/v1/DeleteSnapshotResponse';
import type { DetokenizeRequest as _streambp_v1_DetokenizeRequest, DetokenizeRequest__Output as _streambp_v1_DetokenizeRequest__Output } from './streambp/v1/DetokenizeRequest';
import type { DetokenizeResponse as _streambp_v1_DetokenizeResponse, DetokenizeResponse__Output as _streambp_v1_DetokenizeResponse__Output } from './streambp/v1/DetokenizeResponse';
import type { DpoBatch as _streambp_v1_DpoBatch, DpoBatch__Output as _streambp_v1_DpoBatch__Output } from './streambp/v1/DpoBatch';
import type { DpoOptions as _streambp_v1_DpoOptions, DpoOptions__Output as _streambp_v1_DpoOptions__Output } from './streambp/v1/DpoOptions';
import type { DpoPair as _streambp_v1_DpoPair, DpoPair__Output as _streambp_v1_DpoPair__Output } from './streambp/v1/DpoPair';
import type { EngineOptions as _streambp_v1_EngineOptions, EngineOptions__Output as _streambp_v1_EngineOptions__Output } from './streambp/v1/EngineOptions';
import type { EstimateMemoryRequest as _streambp_v1_EstimateMemoryRequest, EstimateMemoryRequest__Output as _streambp_v1_EstimateMemoryRequest__Output } from './streambp/v1/EstimateMemoryRequest';
import type { EstimateMemoryResponse as _streambp_v1_EstimateMemoryResponse, EstimateMemoryResponse__Output as _streambp_v1_EstimateMemoryResponse__Output } from './streambp/v1/EstimateMemoryResponse';
import type { ExportWeightsRequest as _streambp_v1_ExportWeightsRequest, ExportWeightsRequest__Output as _streambp_v1_ExportWeightsRequest__Output } from './streambp/v1/ExportWeightsRequest';
import type { ForwardBackwardRequest as _streambp_v1_ForwardBackwardRequest, ForwardBackwardRequest__Output as _streambp_v1_ForwardBackwardRequest__Output } from './streambp/v1/ForwardBackwardRequest';
import type { ForwardBackwardResponse as _streambp_v1_ForwardBackwardResponse, ForwardBackwardResponse__Output as _streambp_v1_ForwardBackwardResponse__Output } from './streambp/v1/ForwardBackwardResponse';
import type { GetHistoryRequest as _streambp_v1_GetHistoryRequest, GetHistoryRequest__Output as _streambp_v1_GetHistoryRequest__Output } from './streambp/v1/GetHistoryRequest';
import type { GetHistoryResponse as _streambp_v1_GetHistoryResponse, GetHistoryResponse__Output as _streambp_v1_GetHistoryResponse__Output } from './streambp/v1/GetHistoryResponse';
import type { GetInfoRequest as _streambp_v1_GetInfoRequest, GetInfoRequest__Output as _streambp_v1_GetInfoRequest__Output } from './streambp/v1/GetInfoRequest';
import type { GetInfoResponse as _streambp_v1_GetInfoResponse, GetInfoResponse__Output as _streambp_v1_GetInfoResponse__Output } from './streambp/v1/GetInfoResponse';
import type { GetRolloutStatsRequest as _streambp_v1_GetRolloutStatsRequest, GetRolloutStatsRequest__Output as _streambp_v1_GetRolloutStatsRequest__Output } from './streambp/v1/GetRolloutStatsRequest';
import type { GetSessionRequest as _streambp_v1_GetSessionRequest, GetSessionRequest__Output as _streambp_v1_GetSessionRequest__Output } from './streambp/v1/GetSessionRequest';
import type { GrpoBatch as _streambp_v1_GrpoBatch, GrpoBatch__Output as _streambp_v1_GrpoBatch__Output } from './streambp/v1/GrpoBatch';
import type { GrpoCompletion as _streambp_v1_GrpoCompletion, GrpoCompletion__Output as _streambp_v1_GrpoCompletion__Output } from './streambp/v1/GrpoCompletion';
import type { GrpoGroup as _streambp_v1_GrpoGroup, GrpoGroup__Output as _streambp_v1_GrpoGroup__Output } from './streambp/v1/GrpoGroup';
import type { GrpoOptions as _streambp_v1_GrpoOptions, GrpoOptions__Output as _streambp_v1_GrpoOptions__Output } from './streambp/v1/GrpoOptions';
import type { HistoryRecord as _streambp_v1_HistoryRecord, HistoryRecord__Output as _streambp_v1_HistoryRecord__Output } from './streambp/v1/HistoryRecord';
import type { ListSessionsRequest as _streambp_v1_ListSessionsRequest, ListSessionsRequest__Output as _streambp_v1_ListSessionsRequest__Output } from './streambp/v1/ListSessionsRequest';
import type { ListSessionsResponse as _streambp_v1_ListSessionsResponse, ListSessionsResponse__Output as _streambp_v1_ListSessionsResponse__Output } from './streambp/v1/ListSessionsResponse';
import type { ListSnapshotsRequest as _streambp_v1_ListSnapshotsRequest, ListSnapshotsRequest__Output as _streambp_v1_ListSnapshotsRequest__Output } from './streambp/v1/ListSnapshotsRequest';
import type { ListSnapshotsResponse as _streambp_v1_ListSnapshotsResponse, ListSnapshotsResponse__Output as _streambp_v1_ListSnapshotsResponse__Output } from './streambp/v1/ListSnapshotsResponse';
import type { LoadCheckpointRequest as _streambp_v1_LoadCheckpointRequest, LoadCheckpointRequest__Output as _streambp_v1_LoadCheckpointRequest__Output } from './streambp/v1/LoadCheckpointRequest';
import type { LoadCheckpointResponse as _streambp_v1_LoadCheckpointResponse, LoadCheckpointResponse__Output as _streambp_v1_LoadCheckpointResponse__Output } from './streambp/v1/LoadCheckpointResponse';
import type { LoraConfig as _streambp_v1_LoraConfig, LoraConfig__Output as _streambp_v1_LoraConfig__Output } from './streambp/v1/LoraConfig';
import type { ModelInput as _streambp_v1_ModelInput, ModelInput__Output as _streambp_v1_ModelInput__Output } from './streambp/v1/ModelInput';
import type { ObjectiveInfo as _streambp_v1_ObjectiveInfo, ObjectiveInfo__Output as _streambp_v1_ObjectiveInfo__Output } from './streambp/v1/ObjectiveInfo';
import type { OptimStepRequest as _streambp_v1_OptimStepRequest, OptimStepRequest__Output as _streambp_v1_OptimStepRequest__Output } from './streambp/v1/OptimStepRequest';
import type { OptimStepResponse as _streambp_v1_OptimStepResponse, OptimStepResponse__Output as _streambp_v1_OptimStepResponse__Output } from './streambp/v1/OptimStepResponse';
import type { OptimizerConfig as _streambp_v1_OptimizerConfig, OptimizerConfig__Output as _streambp_v1_OptimizerConfig__Output } from './streambp/v1/OptimizerConfig';
import type { PeftAdapter as _streambp_v1_PeftAdapter, PeftAdapter__Output as _streambp_v1_PeftAdapter__Output } from './streambp/v1/PeftAdapter';
import type { PolicyUpdate as _streambp_v1_PolicyUpdate, PolicyUpdate__Output as _streambp_v1_PolicyUpdate__Output } from './streambp/v1/PolicyUpdate';
import type { PushRolloutsRequest as _streambp_v1_PushRolloutsRequest, PushRolloutsRequest__Output as _streambp_v1_PushRolloutsRequest__Output } from './streambp/v1/PushRolloutsRequest';
import type { PushRolloutsResponse as _streambp_v1_PushRolloutsResponse, PushRolloutsResponse__Output as _streambp_v1_PushRolloutsResponse__Output } from './streambp/v1/PushRolloutsResponse';
import type { RolloutAck as _streambp_v1_RolloutAck, RolloutAck__Output as _streambp_v1_RolloutAck__Output } from './streambp/v1/RolloutAck';
import type { RolloutConfig as _streambp_v1_RolloutConfig, RolloutConfig__Output as _streambp_v1_RolloutConfig__Output } from './streambp/v1/RolloutConfig';
import type { RolloutGroup as _streambp_v1_RolloutGroup, RolloutGroup__Output as _streambp_v1_RolloutGroup__Output } from './streambp/v1/RolloutGroup';
import type { RolloutStats as _streambp_v1_RolloutStats, RolloutStats__Output as _streambp_v1_RolloutStats__Output } from './streambp/v1/RolloutStats';
import type { RoutedExperts as _streambp_v1_RoutedExperts, RoutedExperts__Output as _streambp_v1_RoutedExperts__Output } from './streambp/v1/RoutedExperts';
import type { SampleRequest as _streambp_v1_SampleRequest, SampleRequest__Output as _streambp_v1_SampleRequest__Output } from './streambp/v1/SampleRequest';
import type { SampleResponse as _streambp_v1_SampleResponse, SampleResponse__Output as _streambp_v1_SampleResponse__Output } from './streambp/v1/SampleResponse';
import type { SaveCheckpointRequest as _streambp_v1_SaveCheckpointRequest, SaveCheckpointRequest__Output as _streambp_v1_SaveCheckpointRequest__Output } from './streambp/v1/SaveCheckpointRequest';
import type { SaveCheckpointResponse as _streambp_v1_SaveCheckpointResponse, SaveCheckpointResponse__Output as _streambp_v1_SaveCheckpointResponse__Output } from './streambp/v1/SaveCheckpointResponse';
import type { SaveWeightsForSamplerRequest as _streambp_v1_SaveWeightsForSamplerRequest, SaveWeightsForSamplerRequest__Output as _streambp_v1_SaveWeightsForSamplerRequest__Output } from './streambp/v1/SaveWeightsForSamplerRequest';
import type { ScheduleConfig as _streambp_v1_ScheduleConfig, ScheduleConfig__Output as _streambp_v1_ScheduleConfig__Output } from './streambp/v1/ScheduleConfig';
import type { SequenceLogprobs as _streambp_v1_SequenceLogprobs, SequenceLogprobs__Output as _streambp_v1_SequenceLogprobs__Output } from './streambp/v1/SequenceLogprobs';
import type { SessionInfo as _streambp_v1_SessionInfo, SessionInfo__Output as _streambp_v1_SessionInfo__Output } from './streambp/v1/SessionInfo';
import type { SftBatch as _streambp_v1_SftBatch, SftBatch__Output as _streambp_v1_SftBatch__Output } from './streambp/v1/SftBatch';
import type { SftExample as _streambp_v1_SftExample, SftExample__Output as _streambp_v1_SftExample__Output } from './streambp/v1/SftExample';
import type { SftOptions as _streambp_v1_SftOptions, SftOptions__Output as _streambp_v1_SftOptions__Output } from './streambp/v1/SftOptions';
import type { SnapshotInfo as _streambp_v1_SnapshotInfo, SnapshotInfo__Output as _streambp_v1_SnapshotInfo__Output } from './streambp/v1/SnapshotInfo';
import type { StepProgress as _streambp_v1_StepProgress, StepProgress__Output as _streambp_v1_StepProgress__Output } from './streambp/v1/StepProgress';
import type { StepStats as _streambp_v1_StepStats, StepStats__Output as _streambp_v1_StepStats__Output } from './streambp/v1/StepStats';
import type { TensorData as _streambp_v1_TensorData, TensorData__Output as _streambp_v1_TensorData__Output } from './streambp/v1/TensorData';
import type { Text as _streambp_v1_Text, Text__Output as _streambp_v1_Text__Output } from './streambp/v1/Text';
import type { TokenSequence as _streambp_v1_TokenSequence, TokenSequence__Output as _streambp_v1_TokenSequence__Output } from './streambp/v1/TokenSequence';
import type { TokenizeRequest as _streambp_v1_TokenizeRequest, TokenizeRequest__Output as _streambp_v1_TokenizeRequest__Output } from './streambp/v1/TokenizeRequest';
import type { TokenizeResponse as _streambp_v1_TokenizeResponse, TokenizeResponse__Output as _streambp_v1_TokenizeResponse__Output } from './streambp/v1/TokenizeResponse';
import type { TokenizedText as _streambp_v1_TokenizedText, TokenizedText__Output as _streambp_v1_TokenizedText__Output } from './streambp/v1/TokenizedText';
import type { TokenizerInfo as _streambp_v1_TokenizerInfo, TokenizerInfo__Output as _streambp_v1_TokenizerInfo__Output } from './streambp/v1/TokenizerInfo';
import type { TrainStepRequest as _streambp_v1_TrainStepRequest, TrainStepRequest__Output as _streambp_v1_TrainStepRequest__Output } from './streambp/v1/TrainStepRequest';
import type { TrainStepResponse as _streambp_v1_TrainStepResponse, TrainStepResponse__Output as _streambp_v1_TrainStepResponse__Output } from './streambp/v1/TrainStepResponse';
import type { TrainerClient as _streambp_v1_TrainerClient, TrainerDefinition as _streambp_v1_TrainerDefinition } from './streambp/v1/Trainer';
import type { TrainingConfig as _streambp_v1_TrainingConfig, TrainingConfig__Output as _streambp_v1_TrainingConfig__Output } from './streambp/v1/TrainingConfig';
import type { WatchPolicyRequest as _streambp_v1_WatchPolicyRequest, WatchPolicyRequest__Output as _streambp_v1_WatchPolicyRequest__Output } from './streambp/v1/WatchPolicyRequest';
import type { WeightedLogprobsBatch as _streambp_v1_WeightedLogprobsBatch, WeightedLogprobsBatch__Output as _streambp_v1_WeightedLogprobsBatch__Output } from './streambp/v1/WeightedLogprobsBatch';
import type { WeightedOptions as _streambp_v1_WeightedOptions, WeightedOptions__Output as _streambp_v1_WeightedOptions__Output } from './streambp/v1/WeightedOptions';
import type { WeightedSequence as _streambp_v1_WeightedSequence, WeightedSequence__Output as _streambp_v1_WeightedSequence__Output } from './streambp/v1/WeightedSequence';
import type { WeightsChunk as _streambp_v1_WeightsChunk, WeightsChunk__Output as _streambp_v1_WeightsChunk__Output } from './streambp/v1/WeightsChunk';

type SubtypeConstructor<Constructor extends new (...args: any) => any, Subtype> = {
  new(...args: ConstructorParameters<Constructor>): Subtype;
};

export interface ProtoGrpcType {
  streambp: {
    v1: {
      AdamParams: MessageTypeDefinition<_streambp_v1_AdamParams, _streambp_v1_AdamParams__Output>
      Batch: MessageTypeDefinition<_streambp_v1_Batch, _streambp_v1_Batch__Output>
      ChatMessage: MessageTypeDefinition<_streambp_v1_ChatMessage, _streambp_v1_ChatMessage__Output>
      Completion: MessageTypeDefinition<_streambp_v1_Completion, _streambp_v1_Completion__Output>
      ComputeLogprobsRequest: MessageTypeDefinition<_streambp_v1_ComputeLogprobsRequest, _streambp_v1_ComputeLogprobsRequest__Output>
      ComputeLogprobsResponse: MessageTypeDefinition<_streambp_v1_ComputeLogprobsResponse, _streambp_v1_ComputeLogprobsResponse__Output>
      ConfigValue: MessageTypeDefinition<_streambp_v1_ConfigValue, _streambp_v1_ConfigValue__Output>
      CreateSessionRequest: MessageTypeDefinition<_streambp_v1_CreateSessionRequest, _streambp_v1_CreateSessionRequest__Output>
      Datum: MessageTypeDefinition<_streambp_v1_Datum, _streambp_v1_Datum__Output>
      DatumBatch: MessageTypeDefinition<_streambp_v1_DatumBatch, _streambp_v1_DatumBatch__Output>
      DeleteSessionRequest: MessageTypeDefinition<_streambp_v1_DeleteSessionRequest, _streambp_v1_DeleteSessionRequest__Output>
      DeleteSessionResponse: MessageTypeDefinition<_streambp_v1_DeleteSessionResponse, _streambp_v1_DeleteSessionResponse__Output>
      DeleteSnapshotRequest: MessageTypeDefinition<_streambp_v1_DeleteSnapshotRequest, _streambp_v1_DeleteSnapshotRequest__Output>
      DeleteSnapshotResponse: MessageTypeDefinition<_streambp_v1_DeleteSnapshotResponse, _streambp_v1_DeleteSnapshotResponse__Output>
      DetokenizeRequest: MessageTypeDefinition<_streambp_v1_DetokenizeRequest, _streambp_v1_DetokenizeRequest__Output>
      DetokenizeResponse: MessageTypeDefinition<_streambp_v1_DetokenizeResponse, _streambp_v1_DetokenizeResponse__Output>
      DpoBatch: MessageTypeDefinition<_streambp_v1_DpoBatch, _streambp_v1_DpoBatch__Output>
      DpoOptions: MessageTypeDefinition<_streambp_v1_DpoOptions, _streambp_v1_DpoOptions__Output>
      DpoPair: MessageTypeDefinition<_streambp_v1_DpoPair, _streambp_v1_DpoPair__Output>
      EngineOptions: MessageTypeDefinition<_streambp_v1_EngineOptions, _streambp_v1_EngineOptions__Output>
      EstimateMemoryRequest: MessageTypeDefinition<_streambp_v1_EstimateMemoryRequest, _streambp_v1_EstimateMemoryRequest__Output>
      EstimateMemoryResponse: MessageTypeDefinition<_streambp_v1_EstimateMemoryResponse, _streambp_v1_EstimateMemoryResponse__Output>
      ExportWeightsRequest: MessageTypeDefinition<_streambp_v1_ExportWeightsRequest, _streambp_v1_ExportWeightsRequest__Output>
      ForwardBackwardRequest: MessageTypeDefinition<_streambp_v1_ForwardBackwardRequest, _streambp_v1_ForwardBackwardRequest__Output>
      ForwardBackwardResponse: MessageTypeDefinition<_streambp_v1_ForwardBackwardResponse, _streambp_v1_ForwardBackwardResponse__Output>
      GetHistoryRequest: MessageTypeDefinition<_streambp_v1_GetHistoryRequest, _streambp_v1_GetHistoryRequest__Output>
      GetHistoryResponse: MessageTypeDefinition<_streambp_v1_GetHistoryResponse, _streambp_v1_GetHistoryResponse__Output>
      GetInfoRequest: MessageTypeDefinition<_streambp_v1_GetInfoRequest, _streambp_v1_GetInfoRequest__Output>
      GetInfoResponse: MessageTypeDefinition<_streambp_v1_GetInfoResponse, _streambp_v1_GetInfoResponse__Output>
      GetRolloutStatsRequest: MessageTypeDefinition<_streambp_v1_GetRolloutStatsRequest, _streambp_v1_GetRolloutStatsRequest__Output>
      GetSessionRequest: MessageTypeDefinition<_streambp_v1_GetSessionRequest, _streambp_v1_GetSessionRequest__Output>
      GrpoBatch: MessageTypeDefinition<_streambp_v1_GrpoBatch, _streambp_v1_GrpoBatch__Output>
      GrpoCompletion: MessageTypeDefinition<_streambp_v1_GrpoCompletion, _streambp_v1_GrpoCompletion__Output>
      GrpoGroup: MessageTypeDefinition<_streambp_v1_GrpoGroup, _streambp_v1_GrpoGroup__Output>
      GrpoOptions: MessageTypeDefinition<_streambp_v1_GrpoOptions, _streambp_v1_GrpoOptions__Output>
      HistoryRecord: MessageTypeDefinition<_streambp_v1_HistoryRecord, _streambp_v1_HistoryRecord__Output>
      ListSessionsRequest: MessageTypeDefinition<_streambp_v1_ListSessionsRequest, _streambp_v1_ListSessionsRequest__Output>
      ListSessionsResponse: MessageTypeDefinition<_streambp_v1_ListSessionsResponse, _streambp_v1_ListSessionsResponse__Output>
      ListSnapshotsRequest: MessageTypeDefinition<_streambp_v1_ListSnapshotsRequest, _streambp_v1_ListSnapshotsRequest__Output>
      ListSnapshotsResponse: MessageTypeDefinition<_streambp_v1_ListSnapshotsResponse, _streambp_v1_ListSnapshotsResponse__Output>
      LoadCheckpointRequest: MessageTypeDefinition<_streambp_v1_LoadCheckpointRequest, _streambp_v1_LoadCheckpointRequest__Output>
      LoadCheckpointResponse: MessageTypeDefinition<_streambp_v1_LoadCheckpointResponse, _streambp_v1_LoadCheckpointResponse__Output>
      LoraConfig: MessageTypeDefinition<_streambp_v1_LoraConfig, _streambp_v1_LoraConfig__Output>
      ModelInput: MessageTypeDefinition<_streambp_v1_ModelInput, _streambp_v1_ModelInput__Output>
      ObjectiveInfo: MessageTypeDefinition<_streambp_v1_ObjectiveInfo, _streambp_v1_ObjectiveInfo__Output>
      OptimStepRequest: MessageTypeDefinition<_streambp_v1_OptimStepRequest, _streambp_v1_OptimStepRequest__Output>
      OptimStepResponse: MessageTypeDefinition<_streambp_v1_OptimStepResponse, _streambp_v1_OptimStepResponse__Output>
      OptimizerConfig: MessageTypeDefinition<_streambp_v1_OptimizerConfig, _streambp_v1_OptimizerConfig__Output>
      PeftAdapter: MessageTypeDefinition<_streambp_v1_PeftAdapter, _streambp_v1_PeftAdapter__Output>
      PolicyUpdate: MessageTypeDefinition<_streambp_v1_PolicyUpdate, _streambp_v1_PolicyUpdate__Output>
      PushRolloutsRequest: MessageTypeDefinition<_streambp_v1_PushRolloutsRequest, _streambp_v1_PushRolloutsRequest__Output>
      PushRolloutsResponse: MessageTypeDefinition<_streambp_v1_PushRolloutsResponse, _streambp_v1_PushRolloutsResponse__Output>
      RolloutAck: MessageTypeDefinition<_streambp_v1_RolloutAck, _streambp_v1_RolloutAck__Output>
      RolloutConfig: MessageTypeDefinition<_streambp_v1_RolloutConfig, _streambp_v1_RolloutConfig__Output>
      RolloutGroup: MessageTypeDefinition<_streambp_v1_RolloutGroup, _streambp_v1_RolloutGroup__Output>
      RolloutStats: MessageTypeDefinition<_streambp_v1_RolloutStats, _streambp_v1_RolloutStats__Output>
      RoutedExperts: MessageTypeDefinition<_streambp_v1_RoutedExperts, _streambp_v1_RoutedExperts__Output>
      SampleRequest: MessageTypeDefinition<_streambp_v1_SampleRequest, _streambp_v1_SampleRequest__Output>
      SampleResponse: MessageTypeDefinition<_streambp_v1_SampleResponse, _streambp_v1_SampleResponse__Output>
      SaveCheckpointRequest: MessageTypeDefinition<_streambp_v1_SaveCheckpointRequest, _streambp_v1_SaveCheckpointRequest__Output>
      SaveCheckpointResponse: MessageTypeDefinition<_streambp_v1_SaveCheckpointResponse, _streambp_v1_SaveCheckpointResponse__Output>
      SaveWeightsForSamplerRequest: MessageTypeDefinition<_streambp_v1_SaveWeightsForSamplerRequest, _streambp_v1_SaveWeightsForSamplerRequest__Output>
      ScheduleConfig: MessageTypeDefinition<_streambp_v1_ScheduleConfig, _streambp_v1_ScheduleConfig__Output>
      SequenceLogprobs: MessageTypeDefinition<_streambp_v1_SequenceLogprobs, _streambp_v1_SequenceLogprobs__Output>
      SessionInfo: MessageTypeDefinition<_streambp_v1_SessionInfo, _streambp_v1_SessionInfo__Output>
      SftBatch: MessageTypeDefinition<_streambp_v1_SftBatch, _streambp_v1_SftBatch__Output>
      SftExample: MessageTypeDefinition<_streambp_v1_SftExample, _streambp_v1_SftExample__Output>
      SftOptions: MessageTypeDefinition<_streambp_v1_SftOptions, _streambp_v1_SftOptions__Output>
      SnapshotInfo: MessageTypeDefinition<_streambp_v1_SnapshotInfo, _streambp_v1_SnapshotInfo__Output>
      StepProgress: MessageTypeDefinition<_streambp_v1_StepProgress, _streambp_v1_StepProgress__Output>
      StepStats: MessageTypeDefinition<_streambp_v1_StepStats, _streambp_v1_StepStats__Output>
      TensorData: MessageTypeDefinition<_streambp_v1_TensorData, _streambp_v1_TensorData__Output>
      Text: MessageTypeDefinition<_streambp_v1_Text, _streambp_v1_Text__Output>
      TokenSequence: MessageTypeDefinition<_streambp_v1_TokenSequence, _streambp_v1_TokenSequence__Output>
      TokenizeRequest: MessageTypeDefinition<_streambp_v1_TokenizeRequest, _streambp_v1_TokenizeRequest__Output>
      TokenizeResponse: MessageTypeDefinition<_streambp_v1_TokenizeResponse, _streambp_v1_TokenizeResponse__Output>
      TokenizedText: MessageTypeDefinition<_streambp_v1_TokenizedText, _streambp_v1_TokenizedText__Output>
      TokenizerInfo: MessageTypeDefinition<_streambp_v1_TokenizerInfo, _streambp_v1_TokenizerInfo__Output>
      TrainStepRequest: MessageTypeDefinition<_streambp_v1_TrainStepRequest, _streambp_v1_TrainStepRequest__Output>
      TrainStepResponse: MessageTypeDefinition<_streambp_v1_TrainStepResponse, _streambp_v1_TrainStepResponse__Output>
      Trainer: SubtypeConstructor<typeof grpc.Client, _streambp_v1_TrainerClient> & { service: _streambp_v1_TrainerDefinition }
      TrainingConfig: MessageTypeDefinition<_streambp_v1_TrainingConfig, _streambp_v1_TrainingConfig__Output>
      WatchPolicyRequest: MessageTypeDefinition<_streambp_v1_WatchPolicyRequest, _streambp_v1_WatchPolicyRequest__Output>
      WeightedLogprobsBatch: MessageTypeDefinition<_streambp_v1_WeightedLogprobsBatch, _streambp_v1_WeightedLogprobsBatch__Output>
      WeightedOptions: MessageTypeDefinition<_streambp_v1_WeightedOptions, _streambp_v1_WeightedOptions__Output>
      WeightedSequence: MessageTypeDefinition<_streambp_v1_WeightedSequence, _streambp_v1_WeightedSequence__Output>
      WeightsChunk: MessageTypeDefinition<_streambp_v1_WeightsChunk, _streambp_v1_WeightsChunk__Output>
    }
  }
}

