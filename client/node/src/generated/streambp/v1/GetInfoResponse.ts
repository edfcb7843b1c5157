// Original file: ../../proto/streambp/v1/trainer.proto

import type { SessionInfo as _streambp_v1_SessionInfo, SessionInfo__Output as _streambp_v1_SessionInfo__Output } from '../../streambp/v1/SessionInfo';
import type { TokenizerInfo as _streambp_v1_TokenizerInfo, TokenizerInfo__Output as _streambp_v1_TokenizerInfo__Output } from '../../streambp/v1/TokenizerInfo';
import type { ObjectiveInfo as _streambp_v1_ObjectiveInfo, ObjectiveInfo__Output as _streambp_v1_ObjectiveInfo__Output } from '../../streambp/v1/ObjectiveInfo';
import type { Long } from '@grpc/proto-loader';

export interface GetInfoResponse {
  'architecture'?: (string);
  'num_layers'?: (number | string | Long);
  'hidden_size'?: (number | string | Long);
  'num_heads'?: (number | string | Long);
  'num_kv_heads'?: (number | string | Long);
  'head_dim'?: (number | string | Long);
  'vocab_size'?: (number | string | Long);
  'num_parameters'?: (number | string | Long);
  'dtype'?: (string);
  'device'?: (string);
  /**
   * default engine
   */
  'engine'?: (string);
  /**
   * chunk, logits_chunk, key_chunk: the defaults as chosen for a sequence of
   * max_sequence_length (shorter steps may get smaller ones: each step reports its own)
   */
  'chunk'?: (number | string | Long);
  /**
   * default lm_head+loss chunk (0 = whole sequence, materialized)
   */
  'logits_chunk'?: (number | string | Long);
  'policy_version'?: (number | string | Long);
  'step'?: (number | string | Long);
  'world_size'?: (number);
  'optimizer'?: (string);
  'learning_rate'?: (number | string);
  'max_sequence_length'?: (number | string | Long);
  'max_tokens_per_request'?: (number | string | Long);
  'reference_model'?: (boolean);
  'server_version'?: (string);
  /**
   * LibTorch, BLAS and threads
   */
  'runtime'?: (string);
  /**
   * ForwardBackward calls since the last OptimStep
   */
  'pending_micro_batches'?: (number | string | Long);
  /**
   * default attention key tile of the stream engine (0 = none)
   */
  'key_chunk'?: (number | string | Long);
  /**
   * the server hosts sessions (every model RPC names one)
   */
  'sessions'?: (boolean);
  /**
   * the session asked for, if any
   */
  'session'?: (_streambp_v1_SessionInfo | null);
  'tokenizer'?: (_streambp_v1_TokenizerInfo | null);
  /**
   * the stream engine keeps its stored layer inputs off the device
   */
  'offload_layer_inputs'?: (boolean);
  /**
   * the registered objectives (loss functions)
   */
  'objectives'?: (_streambp_v1_ObjectiveInfo)[];
  /**
   * Ranks every sequence's positions are split over (parallel.context_parallel; 1 = the
   * world_size ranks, if several, are data parallel).
   */
  'context_parallel'?: (number);
}

export interface GetInfoResponse__Output {
  'architecture': (string);
  'num_layers': (number);
  'hidden_size': (number);
  'num_heads': (number);
  'num_kv_heads': (number);
  'head_dim': (number);
  'vocab_size': (number);
  'num_parameters': (number);
  'dtype': (string);
  'device': (string);
  /**
   * default engine
   */
  'engine': (string);
  /**
   * chunk, logits_chunk, key_chunk: the defaults as chosen for a sequence of
   * max_sequence_length (shorter steps may get smaller ones: each step reports its own)
   */
  'chunk': (number);
  /**
   * default lm_head+loss chunk (0 = whole sequence, materialized)
   */
  'logits_chunk': (number);
  'policy_version': (number);
  'step': (number);
  'world_size': (number);
  'optimizer': (string);
  'learning_rate': (number);
  'max_sequence_length': (number);
  'max_tokens_per_request': (number);
  'reference_model': (boolean);
  'server_version': (string);
  /**
   * LibTorch, BLAS and threads
   */
  'runtime': (string);
  /**
   * ForwardBackward calls since the last OptimStep
   */
  'pending_micro_batches': (number);
  /**
   * default attention key tile of the stream engine (0 = none)
   */
  'key_chunk': (number);
  /**
   * the server hosts sessions (every model RPC names one)
   */
  'sessions': (boolean);
  /**
   * the session asked for, if any
   */
  'session': (_streambp_v1_SessionInfo__Output | null);
  'tokenizer': (_streambp_v1_TokenizerInfo__Output | null);
  /**
   * the stream engine keeps its stored layer inputs off the device
   */
  'offload_layer_inputs': (boolean);
  /**
   * the registered objectives (loss functions)
   */
  'objectives': (_streambp_v1_ObjectiveInfo__Output)[];
  /**
   * Ranks every sequence's positions are split over (parallel.context_parallel; 1 = the
   * world_size ranks, if several, are data parallel).
   */
  'context_parallel': (number);
}
