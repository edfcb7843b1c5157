// Original file: ../../proto/streambp/v1/trainer.proto


/**
 * A custom loss that is linear in the per-token log-probs: L = sum_t w_t log p(token_t).
 * A client computes log-probs (ComputeLogprobs), runs its own loss with autograd and sends
 * w = dL/dlogp; the server's gradient is then exactly the gradient of the client's loss.
 */
export interface WeightedSequence {
  'tokens'?: (number)[];
  /**
   * weights[i] multiplies log p(tokens[i+1] | tokens[..i]): one fewer than the tokens,
   * aligned with ComputeLogprobs (0 = no loss at that position).
   */
  'weights'?: (number | string)[];
}

/**
 * A custom loss that is linear in the per-token log-probs: L = sum_t w_t log p(token_t).
 * A client computes log-probs (ComputeLogprobs), runs its own loss with autograd and sends
 * w = dL/dlogp; the server's gradient is then exactly the gradient of the client's loss.
 */
export interface WeightedSequence__Output {
  'tokens': (number)[];
  /**
   * weights[i] multiplies log p(tokens[i+1] | tokens[..i]): one fewer than the tokens,
   * aligned with ComputeLogprobs (0 = no loss at that position).
   */
  'weights': (number)[];
}
