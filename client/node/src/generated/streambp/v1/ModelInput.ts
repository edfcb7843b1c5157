// Original file: ../../proto/streambp/v1/trainer.proto

import type { Text as _streambp_v1_Text, Text__Output as _streambp_v1_Text__Output } from '../../streambp/v1/Text';

/**
 * The tokens the model reads (Tinker's ModelInput), or text the server tokenizes.
 */
export interface ModelInput {
  'tokens'?: (number)[];
  /**
   * Instead of tokens: a string (tokenized with the tokenizer's special tokens and an
   * end-of-sequence token, as an SFT text) or a conversation (rendered with the model's chat
   * format; loss_mask becomes its trained assistant turns). The tokenization's last token is
   * the last target: tokens = all but it, and target_tokens, when not given, the rest. Other
   * per-token inputs need as many values as tokens: Tokenize with this batch shows them.
   */
  'text'?: (_streambp_v1_Text | null);
  /**
   * Optional, one per token, 0 or 1, aligned as loss_fn_inputs (entry t about the token
   * position t predicts): 0 leaves that target out of the loss. Empty = all trained.
   */
  'loss_mask'?: (number)[];
}

/**
 * The tokens the model reads (Tinker's ModelInput), or text the server tokenizes.
 */
export interface ModelInput__Output {
  'tokens': (number)[];
  /**
   * Instead of tokens: a string (tokenized with the tokenizer's special tokens and an
   * end-of-sequence token, as an SFT text) or a conversation (rendered with the model's chat
   * format; loss_mask becomes its trained assistant turns). The tokenization's last token is
   * the last target: tokens = all but it, and target_tokens, when not given, the rest. Other
   * per-token inputs need as many values as tokens: Tokenize with this batch shows them.
   */
  'text': (_streambp_v1_Text__Output | null);
  /**
   * Optional, one per token, 0 or 1, aligned as loss_fn_inputs (entry t about the token
   * position t predicts): 0 leaves that target out of the loss. Empty = all trained.
   */
  'loss_mask': (number)[];
}
