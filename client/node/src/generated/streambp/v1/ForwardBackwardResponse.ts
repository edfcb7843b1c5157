// Original file: ../../proto/streambp/v1/trainer.proto

import type { StepStats as _streambp_v1_StepStats, StepStats__Output as _streambp_v1_StepStats__Output } from '../../streambp/v1/StepStats';
import type { SequenceLogprobs as _streambp_v1_SequenceLogprobs, SequenceLogprobs__Output as _streambp_v1_SequenceLogprobs__Output } from '../../streambp/v1/SequenceLogprobs';
import type { Long } from '@grpc/proto-loader';

export interface ForwardBackwardResponse {
  'stats'?: (_streambp_v1_StepStats | null);
  /**
   * version of the weights the gradients were computed on
   */
  'policy_version'?: (number | string | Long);
  /**
   * return_logprobs: one per sequence of the step, in the batch's order (a datum: its N
   * input positions, entry t = log p(target_tokens[t]); with 2-D target_tokens [N, K], N x K
   * entries row-major, the log-probs of the candidates; a DPO pair: chosen, then rejected;
   * a GRPO group: each completion after its prompt), logprobs and logprobs_fp64 both filled.
   */
  'logprobs'?: (_streambp_v1_SequenceLogprobs)[];
}

export interface ForwardBackwardResponse__Output {
  'stats': (_streambp_v1_StepStats__Output | null);
  /**
   * version of the weights the gradients were computed on
   */
  'policy_version': (number);
  /**
   * return_logprobs: one per sequence of the step, in the batch's order (a datum: its N
   * input positions, entry t = log p(target_tokens[t]); with 2-D target_tokens [N, K], N x K
   * entries row-major, the log-probs of the candidates; a DPO pair: chosen, then rejected;
   * a GRPO group: each completion after its prompt), logprobs and logprobs_fp64 both filled.
   */
  'logprobs': (_streambp_v1_SequenceLogprobs__Output)[];
}
