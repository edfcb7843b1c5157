// Original file: ../../proto/streambp/v1/trainer.proto


/**
 * The experts a mixture-of-experts model routed tokens to, for routing replay: per token (of
 * prompt + completion), per sparse layer, its top-k expert ids, each a little-endian signed
 * integer of bytes_per_id bytes (1 when the model has at most 127 experts, else 2); all k ids
 * of a (token, layer) -1 = the router's choice there. Sample returns it with
 * return_routed_experts; a GRPO completion or a rollout that carries it trains with exactly
 * those experts (weighted by the router's probabilities of them).
 */
export interface RoutedExperts {
  'ids'?: (Buffer | Uint8Array | string);
  /**
   * 1 or 2
   */
  'bytes_per_id'?: (number);
  /**
   * the model's mixture-of-experts layers (checked)
   */
  'sparse_layers'?: (number);
  /**
   * the model's num_experts_per_tok (checked)
   */
  'experts_per_token'?: (number);
}

/**
 * The experts a mixture-of-experts model routed tokens to, for routing replay: per token (of
 * prompt + completion), per sparse layer, its top-k expert ids, each a little-endian signed
 * integer of bytes_per_id bytes (1 when the model has at most 127 experts, else 2); all k ids
 * of a (token, layer) -1 = the router's choice there. Sample returns it with
 * return_routed_experts; a GRPO completion or a rollout that carries it trains with exactly
 * those experts (weighted by the router's probabilities of them).
 */
export interface RoutedExperts__Output {
  'ids': (Buffer);
  /**
   * 1 or 2
   */
  'bytes_per_id': (number);
  /**
   * the model's mixture-of-experts layers (checked)
   */
  'sparse_layers': (number);
  /**
   * the model's num_experts_per_tok (checked)
   */
  'experts_per_token': (number);
}
