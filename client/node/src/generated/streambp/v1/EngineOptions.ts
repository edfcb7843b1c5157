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
}
