// Original file: ../../proto/streambp/v1/trainer.proto

import type { GrpoCompletion as _streambp_v1_GrpoCompletion, GrpoCompletion__Output as _streambp_v1_GrpoCompletion__Output } from '../../streambp/v1/GrpoCompletion';
import type { Text as _streambp_v1_Text, Text__Output as _streambp_v1_Text__Output } from '../../streambp/v1/Text';
import type { Long } from '@grpc/proto-loader';

/**
 * A GRPO group pushed by a rollout worker.
 */
export interface RolloutGroup {
  'prompt'?: (number)[];
  /**
   * rewards and the sampler's log-probs
   */
  'completions'?: (_streambp_v1_GrpoCompletion)[];
  /**
   * the version that sampled it (from Sample)
   */
  'policy_version'?: (number | string | Long);
  /**
   * optional; a repeated id is not trained twice
   */
  'group_id'?: (string);
  /**
   * The session the group trains (PushRolloutsStream; in PushRollouts the request's
   * session applies to groups that leave this empty).
   */
  'session'?: (string);
  /**
   * instead of prompt (see GrpoGroup)
   */
  'prompt_text'?: (_streambp_v1_Text | null);
}

/**
 * A GRPO group pushed by a rollout worker.
 */
export interface RolloutGroup__Output {
  'prompt': (number)[];
  /**
   * rewards and the sampler's log-probs
   */
  'completions': (_streambp_v1_GrpoCompletion__Output)[];
  /**
   * the version that sampled it (from Sample)
   */
  'policy_version': (number);
  /**
   * optional; a repeated id is not trained twice
   */
  'group_id': (string);
  /**
   * The session the group trains (PushRolloutsStream; in PushRollouts the request's
   * session applies to groups that leave this empty).
   */
  'session': (string);
  /**
   * instead of prompt (see GrpoGroup)
   */
  'prompt_text': (_streambp_v1_Text__Output | null);
}
