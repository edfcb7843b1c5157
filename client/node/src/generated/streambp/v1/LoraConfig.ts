// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

export interface LoraConfig {
  /**
   * rank (required, >= 1)
   */
  'r'?: (number);
  /**
   * lora_alpha, default 2 r
   */
  'alpha'?: (number | string);
  /**
   * default q_proj k_proj v_proj o_proj gate_proj up_proj down_proj
   */
  'target_modules'?: (string)[];
  /**
   * scale alpha / sqrt(r)
   */
  'use_rslora'?: (boolean);
  /**
   * initialization of A (B starts at zero)
   */
  'seed'?: (number | string | Long);
  /**
   * PEFT's modules_to_save: ["gate"] trains every mixture-of-experts router as a full copy
   * in the adapter (saved under PEFT's names); default none: the router stays frozen.
   */
  'modules_to_save'?: (string)[];
  '_alpha'?: "alpha";
}

export interface LoraConfig__Output {
  /**
   * rank (required, >= 1)
   */
  'r': (number);
  /**
   * lora_alpha, default 2 r
   */
  'alpha'?: (number);
  /**
   * default q_proj k_proj v_proj o_proj gate_proj up_proj down_proj
   */
  'target_modules': (string)[];
  /**
   * scale alpha / sqrt(r)
   */
  'use_rslora': (boolean);
  /**
   * initialization of A (B starts at zero)
   */
  'seed': (number);
  /**
   * PEFT's modules_to_save: ["gate"] trains every mixture-of-experts router as a full copy
   * in the adapter (saved under PEFT's names); default none: the router stays frozen.
   */
  'modules_to_save': (string)[];
  '_alpha'?: "alpha";
}
