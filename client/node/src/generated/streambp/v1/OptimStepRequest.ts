// Original file: ../../proto/streambp/v1/trainer.proto

import type { AdamParams as _streambp_v1_AdamParams, AdamParams__Output as _streambp_v1_AdamParams__Output } from '../../streambp/v1/AdamParams';

export interface OptimStepRequest {
  'request_id'?: (string);
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session'?: (string);
  /**
   * This step's Adam parameters instead of the session's optimizer configuration and
   * learning-rate schedule (Tinker's AdamParams); absent: the configuration. The session's
   * optimizer must be adamw; its state carries on; later steps without adam_params use the
   * configuration again.
   */
  'adam_params'?: (_streambp_v1_AdamParams | null);
}

export interface OptimStepRequest__Output {
  'request_id': (string);
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session': (string);
  /**
   * This step's Adam parameters instead of the session's optimizer configuration and
   * learning-rate schedule (Tinker's AdamParams); absent: the configuration. The session's
   * optimizer must be adamw; its state carries on; later steps without adam_params use the
   * configuration again.
   */
  'adam_params': (_streambp_v1_AdamParams__Output | null);
}
