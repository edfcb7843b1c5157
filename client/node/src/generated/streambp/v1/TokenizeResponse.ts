// Original file: ../../proto/streambp/v1/trainer.proto

import type { TokenizedText as _streambp_v1_TokenizedText, TokenizedText__Output as _streambp_v1_TokenizedText__Output } from '../../streambp/v1/TokenizedText';
import type { Batch as _streambp_v1_Batch, Batch__Output as _streambp_v1_Batch__Output } from '../../streambp/v1/Batch';

export interface TokenizeResponse {
  'outputs'?: (_streambp_v1_TokenizedText)[];
  /**
   * the request's batch with ids (and loss masks) in place of text
   */
  'batch'?: (_streambp_v1_Batch | null);
}

export interface TokenizeResponse__Output {
  'outputs': (_streambp_v1_TokenizedText__Output)[];
  /**
   * the request's batch with ids (and loss masks) in place of text
   */
  'batch': (_streambp_v1_Batch__Output | null);
}
