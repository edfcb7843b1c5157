// Original file: ../../proto/streambp/v1/trainer.proto


/**
 * One chat message. role: system | user | assistant | tool.
 */
export interface ChatMessage {
  'role'?: (string);
  'content'?: (string);
  /**
   * The assistant's reasoning (qwen3 renders it inside <think>...</think>).
   */
  'reasoning_content'?: (string);
  /**
   * Whether an assistant message is trained on (default: every assistant message).
   */
  'train'?: (boolean);
  '_reasoning_content'?: "reasoning_content";
  '_train'?: "train";
}

/**
 * One chat message. role: system | user | assistant | tool.
 */
export interface ChatMessage__Output {
  'role': (string);
  'content': (string);
  /**
   * The assistant's reasoning (qwen3 renders it inside <think>...</think>).
   */
  'reasoning_content'?: (string);
  /**
   * Whether an assistant message is trained on (default: every assistant message).
   */
  'train'?: (boolean);
  '_reasoning_content'?: "reasoning_content";
  '_train'?: "train";
}
