// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

/**
 * The model folder's tokenizer as the server uses it.
 */
export interface TokenizerInfo {
  /**
   * false: no tokenizer.json in the model folder
   */
  'available'?: (boolean);
  /**
   * "BPE (byte-level)" or "BPE (characters, byte fallback)"
   */
  'type'?: (string);
  /**
   * tokenizer's vocabulary incl. added tokens
   */
  'vocab_size'?: (number | string | Long);
  /**
   * qwen3 | llama3 | llama3.1 | llama3.2 | gemma | chatml | ""
   */
  'chat_format'?: (string);
  /**
   * Sample stops at these unless ignore_eos
   */
  'eos_token_ids'?: (number)[];
  'bos_token'?: (string);
  'eos_token'?: (string);
}

/**
 * The model folder's tokenizer as the server uses it.
 */
export interface TokenizerInfo__Output {
  /**
   * false: no tokenizer.json in the model folder
   */
  'available': (boolean);
  /**
   * "BPE (byte-level)" or "BPE (characters, byte fallback)"
   */
  'type': (string);
  /**
   * tokenizer's vocabulary incl. added tokens
   */
  'vocab_size': (number);
  /**
   * qwen3 | llama3 | llama3.1 | llama3.2 | gemma | chatml | ""
   */
  'chat_format': (string);
  /**
   * Sample stops at these unless ignore_eos
   */
  'eos_token_ids': (number)[];
  'bos_token': (string);
  'eos_token': (string);
}
