// Original file: ../../proto/streambp/v1/trainer.proto

import type { StepStats as _streambp_v1_StepStats, StepStats__Output as _streambp_v1_StepStats__Output } from '../../streambp/v1/StepStats';
import type { Long } from '@grpc/proto-loader';

export interface ForwardBackwardResponse {
  'stats'?: (_streambp_v1_StepStats | null);
  /**
   * version of the weights the gradients were computed on
   */
  'policy_version'?: (number | string | Long);
}

export interface ForwardBackwardResponse__Output {
  'stats': (_streambp_v1_StepStats__Output | null);
  /**
   * version of the weights the gradients were computed on
   */
  'policy_version': (number);
}
