// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

export interface PolicyUpdate {
  'policy_version'?: (number | string | Long);
  'step'?: (number | string | Long);
  /**
   * "rollouts" (server-side step) | "train" (TrainStep/OptimStep) | "load"
   */
  'source'?: (string);
  'loss'?: (number | string);
  'reward_mean'?: (number | string);
  'kl'?: (number | string);
  'clip_fraction'?: (number | string);
  'tokens'?: (number | string | Long);
  'groups_consumed'?: (number | string | Long);
  /**
   * stale groups dropped since the previous update
   */
  'groups_dropped'?: (number | string | Long);
  'metrics'?: ({[key: string]: number | string});
}

export interface PolicyUpdate__Output {
  'policy_version': (number);
  'step': (number);
  /**
   * "rollouts" (server-side step) | "train" (TrainStep/OptimStep) | "load"
   */
  'source': (string);
  'loss': (number);
  'reward_mean': (number);
  'kl': (number);
  'clip_fraction': (number);
  'tokens': (number);
  'groups_consumed': (number);
  /**
   * stale groups dropped since the previous update
   */
  'groups_dropped': (number);
  'metrics': ({[key: string]: number});
}
