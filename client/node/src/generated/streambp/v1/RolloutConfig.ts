// Original file: ../../proto/streambp/v1/trainer.proto

import type { GrpoOptions as _streambp_v1_GrpoOptions, GrpoOptions__Output as _streambp_v1_GrpoOptions__Output } from '../../streambp/v1/GrpoOptions';
import type { Long } from '@grpc/proto-loader';

/**
 * The session's RL loop; unset fields take the server's rollouts config.
 */
export interface RolloutConfig {
  'groups_per_step'?: (number | string | Long);
  'max_staleness'?: (number | string | Long);
  'grpo'?: (_streambp_v1_GrpoOptions | null);
  '_groups_per_step'?: "groups_per_step";
  '_max_staleness'?: "max_staleness";
}

/**
 * The session's RL loop; unset fields take the server's rollouts config.
 */
export interface RolloutConfig__Output {
  'groups_per_step'?: (number);
  'max_staleness'?: (number);
  'grpo': (_streambp_v1_GrpoOptions__Output | null);
  '_groups_per_step'?: "groups_per_step";
  '_max_staleness'?: "max_staleness";
}
