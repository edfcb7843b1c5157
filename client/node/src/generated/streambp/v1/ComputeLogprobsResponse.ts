// Original file: ../../proto/streambp/v1/trainer.proto

import type { SequenceLogprobs as _streambp_v1_SequenceLogprobs, SequenceLogprobs__Output as _streambp_v1_SequenceLogprobs__Output } from '../../streambp/v1/SequenceLogprobs';
import type { Long } from '@grpc/proto-loader';

export interface ComputeLogprobsResponse {
  'sequences'?: (_streambp_v1_SequenceLogprobs)[];
  'policy_version'?: (number | string | Long);
}

export interface ComputeLogprobsResponse__Output {
  'sequences': (_streambp_v1_SequenceLogprobs__Output)[];
  'policy_version': (number);
}
