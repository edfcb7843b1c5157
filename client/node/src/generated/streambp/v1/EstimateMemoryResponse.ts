// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

export interface EstimateMemoryResponse {
  'weights_bytes'?: (number | string | Long);
  'gradient_bytes'?: (number | string | Long);
  'optimizer_bytes'?: (number | string | Long);
  /**
   * predicted peak of the step beyond the three above
   */
  'activation_bytes'?: (number | string | Long);
  'total_bytes'?: (number | string | Long);
  /**
   * configured budget, 0 = none
   */
  'budget_bytes'?: (number | string | Long);
  'fits'?: (boolean);
  'engine'?: (string);
  'chunk'?: (number | string | Long);
  'logits_chunk'?: (number | string | Long);
  'key_chunk'?: (number | string | Long);
  /**
   * held in the second tier (offloaded layer inputs), not in total_bytes
   */
  'offloaded_bytes'?: (number | string | Long);
}

export interface EstimateMemoryResponse__Output {
  'weights_bytes': (number);
  'gradient_bytes': (number);
  'optimizer_bytes': (number);
  /**
   * predicted peak of the step beyond the three above
   */
  'activation_bytes': (number);
  'total_bytes': (number);
  /**
   * configured budget, 0 = none
   */
  'budget_bytes': (number);
  'fits': (boolean);
  'engine': (string);
  'chunk': (number);
  'logits_chunk': (number);
  'key_chunk': (number);
  /**
   * held in the second tier (offloaded layer inputs), not in total_bytes
   */
  'offloaded_bytes': (number);
}
