// Original file: ../../proto/streambp/v1/trainer.proto

import type { WeightedSequence as _streambp_v1_WeightedSequence, WeightedSequence__Output as _streambp_v1_WeightedSequence__Output } from '../../streambp/v1/WeightedSequence';
import type { Long } from '@grpc/proto-loader';

export interface WeightedLogprobsBatch {
  'sequences'?: (_streambp_v1_WeightedSequence)[];
  /**
   * The policy version the weights were computed at (ComputeLogprobsResponse.
   * policy_version); refused with FAILED_PRECONDITION when the policy has moved since.
   * Unset = not checked.
   */
  'policy_version'?: (number | string | Long);
  '_policy_version'?: "policy_version";
}

export interface WeightedLogprobsBatch__Output {
  'sequences': (_streambp_v1_WeightedSequence__Output)[];
  /**
   * The policy version the weights were computed at (ComputeLogprobsResponse.
   * policy_version); refused with FAILED_PRECONDITION when the policy has moved since.
   * Unset = not checked.
   */
  'policy_version'?: (number);
  '_policy_version'?: "policy_version";
}
