// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

/**
 * One optimizer step of a session.
 */
export interface HistoryRecord {
  /**
   * 1, 2, ... within the session's history (kept across restarts)
   */
  'index'?: (number | string | Long);
  /**
   * the optimizer step after this one
   */
  'step'?: (number | string | Long);
  /**
   * of the weights after it
   */
  'policy_version'?: (number | string | Long);
  /**
   * train (TrainStep) | optim_step (ForwardBackward + OptimStep) | rollouts
   */
  'source'?: (string);
  /**
   * wall clock when it ended, seconds since the Unix epoch
   */
  'time'?: (number | string);
  /**
   * the forward-backwards' loss (their mean when several)
   */
  'loss'?: (number | string);
  /**
   * non-padding tokens trained on
   */
  'tokens'?: (number | string | Long);
  /**
   * forward-backwards accumulated into the step
   */
  'forward_backwards'?: (number | string | Long);
  /**
   * tokens / seconds
   */
  'tokens_per_second'?: (number | string);
  /**
   * device time of the forward-backwards and the optimizer step
   */
  'seconds'?: (number | string);
  /**
   * the largest forward-backward's peak
   */
  'peak_memory_bytes'?: (number | string | Long);
  /**
   * before clipping
   */
  'grad_norm'?: (number | string);
  'learning_rate'?: (number | string);
  /**
   * nothing was applied (skip_reason says why)
   */
  'skipped'?: (boolean);
  'skip_reason'?: (string);
  /**
   * rollout steps: groups trained on
   */
  'groups_consumed'?: (number | string | Long);
  /**
   * the objective's: reward_mean, kl, clip_ratio/..., ...
   */
  'metrics'?: ({[key: string]: number | string});
}

/**
 * One optimizer step of a session.
 */
export interface HistoryRecord__Output {
  /**
   * 1, 2, ... within the session's history (kept across restarts)
   */
  'index': (number);
  /**
   * the optimizer step after this one
   */
  'step': (number);
  /**
   * of the weights after it
   */
  'policy_version': (number);
  /**
   * train (TrainStep) | optim_step (ForwardBackward + OptimStep) | rollouts
   */
  'source': (string);
  /**
   * wall clock when it ended, seconds since the Unix epoch
   */
  'time': (number);
  /**
   * the forward-backwards' loss (their mean when several)
   */
  'loss': (number);
  /**
   * non-padding tokens trained on
   */
  'tokens': (number);
  /**
   * forward-backwards accumulated into the step
   */
  'forward_backwards': (number);
  /**
   * tokens / seconds
   */
  'tokens_per_second': (number);
  /**
   * device time of the forward-backwards and the optimizer step
   */
  'seconds': (number);
  /**
   * the largest forward-backward's peak
   */
  'peak_memory_bytes': (number);
  /**
   * before clipping
   */
  'grad_norm': (number);
  'learning_rate': (number);
  /**
   * nothing was applied (skip_reason says why)
   */
  'skipped': (boolean);
  'skip_reason': (string);
  /**
   * rollout steps: groups trained on
   */
  'groups_consumed': (number);
  /**
   * the objective's: reward_mean, kl, clip_ratio/..., ...
   */
  'metrics': ({[key: string]: number});
}
