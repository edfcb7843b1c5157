// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

export interface EngineOptions {
  /**
   * full | checkpoint | stream; empty = the server's default
   */
  'engine'?: (string);
  /**
   * stream: query positions per chunk; 0 = the server's default
   */
  'chunk'?: (number | string | Long);
  /**
   * positions per lm_head+loss chunk; 0 = the server's default
   */
  'logits_chunk'?: (number | string | Long);
  /**
   * stream: keys per attention tile inside a chunk (online softmax);
   */
  'key_chunk'?: (number | string | Long);
  /**
   * 0 = the server's default
   * Mixture-of-experts models: the coefficient of the router's load-balancing loss (HF's
   * load_balancing_loss_func) added to the loss; unset = the server's (by default the
   * model's: router_aux_loss_coef when config.json's output_router_logits is true); 0 = off.
   */
  'router_aux_loss_coef'?: (number | string);
  '_router_aux_loss_coef'?: "router_aux_loss_coef";
}

export interface EngineOptions__Output {
  /**
   * full | checkpoint | stream; empty = the server's default
   */
  'engine': (string);
  /**
   * stream: query positions per chunk; 0 = the server's default
   */
  'chunk': (number);
  /**
   * positions per lm_head+loss chunk; 0 = the server's default
   */
  'logits_chunk': (number);
  /**
   * stream: keys per attention tile inside a chunk (online softmax);
   */
  'key_chunk': (number);
  /**
   * 0 = the server's default
   * Mixture-of-experts models: the coefficient of the router's load-balancing loss (HF's
   * load_balancing_loss_func) added to the loss; unset = the server's (by default the
   * model's: router_aux_loss_coef when config.json's output_router_logits is true); 0 = off.
   */
  'router_aux_loss_coef'?: (number);
  '_router_aux_loss_coef'?: "router_aux_loss_coef";
}
