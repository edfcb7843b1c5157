// Original file: ../../proto/streambp/v1/trainer.proto

import type { Batch as _streambp_v1_Batch, Batch__Output as _streambp_v1_Batch__Output } from '../../streambp/v1/Batch';
import type { SftOptions as _streambp_v1_SftOptions, SftOptions__Output as _streambp_v1_SftOptions__Output } from '../../streambp/v1/SftOptions';
import type { DpoOptions as _streambp_v1_DpoOptions, DpoOptions__Output as _streambp_v1_DpoOptions__Output } from '../../streambp/v1/DpoOptions';
import type { GrpoOptions as _streambp_v1_GrpoOptions, GrpoOptions__Output as _streambp_v1_GrpoOptions__Output } from '../../streambp/v1/GrpoOptions';
import type { EngineOptions as _streambp_v1_EngineOptions, EngineOptions__Output as _streambp_v1_EngineOptions__Output } from '../../streambp/v1/EngineOptions';
import type { WeightedOptions as _streambp_v1_WeightedOptions, WeightedOptions__Output as _streambp_v1_WeightedOptions__Output } from '../../streambp/v1/WeightedOptions';
import type { ConfigValue as _streambp_v1_ConfigValue, ConfigValue__Output as _streambp_v1_ConfigValue__Output } from '../../streambp/v1/ConfigValue';

export interface ForwardBackwardRequest {
  'request_id'?: (string);
  'batch'?: (_streambp_v1_Batch | null);
  /**
   * The objective: empty = the batch kind (sft, dpo, grpo); else a registered objective
   * name whose batch kind matches.
   */
  'objective'?: (string);
  'sft'?: (_streambp_v1_SftOptions | null);
  'dpo'?: (_streambp_v1_DpoOptions | null);
  'grpo'?: (_streambp_v1_GrpoOptions | null);
  'engine'?: (_streambp_v1_EngineOptions | null);
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session'?: (string);
  'weighted'?: (_streambp_v1_WeightedOptions | null);
  /**
   * The objective's options by name (Tinker's loss_fn_config), instead of the options
   * message: any objective, any batch kind; an unknown key is refused naming the known ones.
   */
  'loss_fn_config'?: ({[key: string]: _streambp_v1_ConfigValue});
  /**
   * Also return each sequence's per-token log-probs at the weights the gradients were
   * computed on (Tinker's loss_fn_outputs "logprobs"): one more forward pass without a
   * backward (about a third of the step's time).
   */
  'return_logprobs'?: (boolean);
  'options'?: "sft"|"dpo"|"grpo"|"weighted";
}

export interface ForwardBackwardRequest__Output {
  'request_id': (string);
  'batch': (_streambp_v1_Batch__Output | null);
  /**
   * The objective: empty = the batch kind (sft, dpo, grpo); else a registered objective
   * name whose batch kind matches.
   */
  'objective': (string);
  'sft'?: (_streambp_v1_SftOptions__Output | null);
  'dpo'?: (_streambp_v1_DpoOptions__Output | null);
  'grpo'?: (_streambp_v1_GrpoOptions__Output | null);
  'engine': (_streambp_v1_EngineOptions__Output | null);
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session': (string);
  'weighted'?: (_streambp_v1_WeightedOptions__Output | null);
  /**
   * The objective's options by name (Tinker's loss_fn_config), instead of the options
   * message: any objective, any batch kind; an unknown key is refused naming the known ones.
   */
  'loss_fn_config': ({[key: string]: _streambp_v1_ConfigValue__Output});
  /**
   * Also return each sequence's per-token log-probs at the weights the gradients were
   * computed on (Tinker's loss_fn_outputs "logprobs"): one more forward pass without a
   * backward (about a third of the step's time).
   */
  'return_logprobs': (boolean);
  'options'?: "sft"|"dpo"|"grpo"|"weighted";
}
