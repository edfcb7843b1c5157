// Original file: ../../proto/streambp/v1/trainer.proto

import type { TokenSequence as _streambp_v1_TokenSequence, TokenSequence__Output as _streambp_v1_TokenSequence__Output } from '../../streambp/v1/TokenSequence';

export interface ComputeLogprobsRequest {
  'sequences'?: (_streambp_v1_TokenSequence)[];
  /**
   * the frozen reference model instead of the policy
   */
  'reference'?: (boolean);
  /**
   * logits / temperature, default 1
   */
  'temperature'?: (number | string);
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session'?: (string);
  /**
   * Also return the log-probs in double precision (SequenceLogprobs.logprobs_fp64): what a
   * client-side custom loss differentiates, so that its weights are exact.
   */
  'fp64'?: (boolean);
  /**
   * Also the top_k most likely next tokens at every position with their log-probs (Tinker's
   * topk_prompt_logprobs; distillation targets); 0 = none. At most 20 (and the vocabulary),
   * and tokens x top_k at most limits.max_tokens_per_request (RESOURCE_EXHAUSTED beyond).
   */
  'top_k'?: (number);
  /**
   * A sampler snapshot of the session (SaveWeightsForSampler) instead of its current weights.
   */
  'snapshot'?: (string);
  '_temperature'?: "temperature";
}

export interface ComputeLogprobsRequest__Output {
  'sequences': (_streambp_v1_TokenSequence__Output)[];
  /**
   * the frozen reference model instead of the policy
   */
  'reference': (boolean);
  /**
   * logits / temperature, default 1
   */
  'temperature'?: (number);
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session': (string);
  /**
   * Also return the log-probs in double precision (SequenceLogprobs.logprobs_fp64): what a
   * client-side custom loss differentiates, so that its weights are exact.
   */
  'fp64': (boolean);
  /**
   * Also the top_k most likely next tokens at every position with their log-probs (Tinker's
   * topk_prompt_logprobs; distillation targets); 0 = none. At most 20 (and the vocabulary),
   * and tokens x top_k at most limits.max_tokens_per_request (RESOURCE_EXHAUSTED beyond).
   */
  'top_k': (number);
  /**
   * A sampler snapshot of the session (SaveWeightsForSampler) instead of its current weights.
   */
  'snapshot': (string);
  '_temperature'?: "temperature";
}
