// Original file: ../../proto/streambp/v1/trainer.proto

import type { GrpoCompletion as _streambp_v1_GrpoCompletion, GrpoCompletion__Output as _streambp_v1_GrpoCompletion__Output } from '../../streambp/v1/GrpoCompletion';
import type { Text as _streambp_v1_Text, Text__Output as _streambp_v1_Text__Output } from '../../streambp/v1/Text';
import type { Long } from '@grpc/proto-loader';

/**
 * Completions of one prompt.
 */
export interface GrpoGroup {
  'prompt'?: (number)[];
  'completions'?: (_streambp_v1_GrpoCompletion)[];
  /**
   * Optional client id of the group (idempotent rollout pushes use it).
   */
  'group_id'?: (string);
  /**
   * The policy version that sampled the completions (0 = unknown).
   */
  'policy_version'?: (number | string | Long);
  /**
   * Instead of prompt: the prompt as text or messages (rendered with the generation prompt).
   */
  'prompt_text'?: (_streambp_v1_Text | null);
}

/**
 * Completions of one prompt.
 */
export interface GrpoGroup__Output {
  'prompt': (number)[];
  'completions': (_streambp_v1_GrpoCompletion__Output)[];
  /**
   * Optional client id of the group (idempotent rollout pushes use it).
   */
  'group_id': (string);
  /**
   * The policy version that sampled the completions (0 = unknown).
   */
  'policy_version': (number);
  /**
   * Instead of prompt: the prompt as text or messages (rendered with the generation prompt).
   */
  'prompt_text': (_streambp_v1_Text__Output | null);
}
