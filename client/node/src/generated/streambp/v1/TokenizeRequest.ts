// Original file: ../../proto/streambp/v1/trainer.proto

import type { Text as _streambp_v1_Text, Text__Output as _streambp_v1_Text__Output } from '../../streambp/v1/Text';
import type { Batch as _streambp_v1_Batch, Batch__Output as _streambp_v1_Batch__Output } from '../../streambp/v1/Batch';

export interface TokenizeRequest {
  'inputs'?: (_streambp_v1_Text)[];
  /**
   * Plain text: add the tokenizer's special tokens (e.g. Llama 3's <|begin_of_text|>),
   * as Hugging Face's add_special_tokens. Messages always render their own.
   */
  'add_special_tokens'?: (boolean);
  /**
   * Messages: end with the assistant's generation prompt (as for Sample).
   */
  'add_generation_prompt'?: (boolean);
  /**
   * A batch whose text forms are resolved to ids exactly as ForwardBackward would (what a
   * step with it trains on); returned in TokenizeResponse.batch.
   */
  'batch'?: (_streambp_v1_Batch | null);
}

export interface TokenizeRequest__Output {
  'inputs': (_streambp_v1_Text__Output)[];
  /**
   * Plain text: add the tokenizer's special tokens (e.g. Llama 3's <|begin_of_text|>),
   * as Hugging Face's add_special_tokens. Messages always render their own.
   */
  'add_special_tokens': (boolean);
  /**
   * Messages: end with the assistant's generation prompt (as for Sample).
   */
  'add_generation_prompt': (boolean);
  /**
   * A batch whose text forms are resolved to ids exactly as ForwardBackward would (what a
   * step with it trains on); returned in TokenizeResponse.batch.
   */
  'batch': (_streambp_v1_Batch__Output | null);
}
