// Original file: ../../proto/streambp/v1/trainer.proto

import type { ChatMessage as _streambp_v1_ChatMessage, ChatMessage__Output as _streambp_v1_ChatMessage__Output } from '../../streambp/v1/ChatMessage';

/**
 * A text input: a plain string or a conversation (exactly one).
 */
export interface Text {
  'text'?: (string);
  'messages'?: (_streambp_v1_ChatMessage)[];
  /**
   * qwen3 only: render the generation prompt with thinking on (default) or off.
   */
  'enable_thinking'?: (boolean);
  '_enable_thinking'?: "enable_thinking";
}

/**
 * A text input: a plain string or a conversation (exactly one).
 */
export interface Text__Output {
  'text': (string);
  'messages': (_streambp_v1_ChatMessage__Output)[];
  /**
   * qwen3 only: render the generation prompt with thinking on (default) or off.
   */
  'enable_thinking'?: (boolean);
  '_enable_thinking'?: "enable_thinking";
}
