// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

export interface OptimStepResponse {
  /**
   * after the step
   */
  'policy_version'?: (number | string | Long);
  'step'?: (number | string | Long);
  'learning_rate'?: (number | string);
  /**
   * before clipping
   */
  'grad_norm'?: (number | string);
  /**
   * non-finite loss or gradient: nothing applied, gradients cleared
   */
  'skipped'?: (boolean);
  'skip_reason'?: (string);
}

export interface OptimStepResponse__Output {
  /**
   * after the step
   */
  'policy_version': (number);
  'step': (number);
  'learning_rate': (number);
  /**
   * before clipping
   */
  'grad_norm': (number);
  /**
   * non-finite loss or gradient: nothing applied, gradients cleared
   */
  'skipped': (boolean);
  'skip_reason': (string);
}
