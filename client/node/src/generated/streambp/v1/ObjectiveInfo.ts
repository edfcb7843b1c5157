// Original file: ../../proto/streambp/v1/trainer.proto


/**
 * A registered objective: the request's objective (loss_fn) names it.
 */
export interface ObjectiveInfo {
  'name'?: (string);
  /**
   * the typed batch it trains on: sft | dpo | grpo | weighted
   */
  'batch_kind'?: (string);
  /**
   * the keys of loss_fn_config (and of its options message)
   */
  'options'?: (string)[];
  /**
   * The loss_fn_inputs a datum gives it besides target_tokens, required ones first; none:
   * it takes no data batch.
   */
  'inputs'?: (string)[];
  'optional_inputs'?: (string)[];
}

/**
 * A registered objective: the request's objective (loss_fn) names it.
 */
export interface ObjectiveInfo__Output {
  'name': (string);
  /**
   * the typed batch it trains on: sft | dpo | grpo | weighted
   */
  'batch_kind': (string);
  /**
   * the keys of loss_fn_config (and of its options message)
   */
  'options': (string)[];
  /**
   * The loss_fn_inputs a datum gives it besides target_tokens, required ones first; none:
   * it takes no data batch.
   */
  'inputs': (string)[];
  'optional_inputs': (string)[];
}
