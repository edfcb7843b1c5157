// Original file: ../../proto/streambp/v1/trainer.proto

import type { ChatMessage as _streambp_v1_ChatMessage, ChatMessage__Output as _streambp_v1_ChatMessage__Output } from '../../streambp/v1/ChatMessage';
import type { Text as _streambp_v1_Text, Text__Output as _streambp_v1_Text__Output } from '../../streambp/v1/Text';

/**
 * One SFT example: either tokens (+ optional loss_mask) or prompt + completion.
 */
export interface SftExample {
  /**
   * Token ids of the whole sequence.
   */
  'tokens'?: (number)[];
  /**
   * Optional, one entry per token, 0 or 1: loss_mask[i] = 1 makes token i a target,
   * predicted from the tokens before it (loss_mask[0] has no effect). Empty = all ones.
   */
  'loss_mask'?: (number)[];
  /**
   * Alternative to tokens: the loss is on the completion only.
   */
  'prompt'?: (number)[];
  'completion'?: (number)[];
  'text'?: (string);
  'messages'?: (_streambp_v1_ChatMessage)[];
  'prompt_text'?: (_streambp_v1_Text | null);
  'completion_text'?: (_streambp_v1_Text | null);
}

/**
 * One SFT example: either tokens (+ optional loss_mask) or prompt + completion.
 */
export interface SftExample__Output {
  /**
   * Token ids of the whole sequence.
   */
  'tokens': (number)[];
  /**
   * Optional, one entry per token, 0 or 1: loss_mask[i] = 1 makes token i a target,
   * predicted from the tokens before it (loss_mask[0] has no effect). Empty = all ones.
   */
  'loss_mask': (number)[];
  /**
   * Alternative to tokens: the loss is on the completion only.
   */
  'prompt': (number)[];
  'completion': (number)[];
  'text': (string);
  'messages': (_streambp_v1_ChatMessage__Output)[];
  'prompt_text': (_streambp_v1_Text__Output | null);
  'completion_text': (_streambp_v1_Text__Output | null);
}
