// Original file: ../../proto/streambp/v1/trainer.proto

import type { Completion as _streambp_v1_Completion, Completion__Output as _streambp_v1_Completion__Output } from '../../streambp/v1/Completion';
import type { Long } from '@grpc/proto-loader';

export interface SampleResponse {
  /**
   * prompt by prompt, n each
   */
  'completions'?: (_streambp_v1_Completion)[];
  'policy_version'?: (number | string | Long);
}

export interface SampleResponse__Output {
  /**
   * prompt by prompt, n each
   */
  'completions': (_streambp_v1_Completion__Output)[];
  'policy_version': (number);
}
