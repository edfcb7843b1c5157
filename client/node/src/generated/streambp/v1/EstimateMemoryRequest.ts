// Original file: ../../proto/streambp/v1/trainer.proto

import type { EngineOptions as _streambp_v1_EngineOptions, EngineOptions__Output as _streambp_v1_EngineOptions__Output } from '../../streambp/v1/EngineOptions';
import type { Long } from '@grpc/proto-loader';

export interface EstimateMemoryRequest {
  'seq_len'?: (number | string | Long);
  /**
   * rows, default 1
   */
  'batch'?: (number | string | Long);
  'engine'?: (_streambp_v1_EngineOptions | null);
  /**
   * estimate for this session (an adapter: frozen base)
   */
  'session'?: (string);
}

export interface EstimateMemoryRequest__Output {
  'seq_len': (number);
  /**
   * rows, default 1
   */
  'batch': (number);
  'engine': (_streambp_v1_EngineOptions__Output | null);
  /**
   * estimate for this session (an adapter: frozen base)
   */
  'session': (string);
}
