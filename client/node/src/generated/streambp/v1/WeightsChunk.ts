// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

/**
 * Pieces of one safetensors file, in order. The first message carries the totals.
 */
export interface WeightsChunk {
  'policy_version'?: (number | string | Long);
  'total_bytes'?: (number | string | Long);
  'offset'?: (number | string | Long);
  'data'?: (Buffer | Uint8Array | string);
  /**
   * On the last message: SHA-256 (hex) of the whole file, and config.json of the model.
   */
  'sha256'?: (string);
  'config_json'?: (string);
  'last'?: (boolean);
  /**
   * On the first message: set when the requested version is not the one served.
   */
  'note'?: (string);
  /**
   * What the file is: "model" (model.safetensors; config_json is config.json) or
   * "peft_adapter" (adapter_model.safetensors; config_json is adapter_config.json).
   */
  'format'?: (string);
  /**
   * with_files: the file this piece belongs to ("" = the weights, always first; then e.g.
   * "tokenizer.json"). Each file has its own offset and total_bytes, and its last piece
   * carries last = true and its sha256; the stream ends after the last file.
   */
  'file'?: (string);
}

/**
 * Pieces of one safetensors file, in order. The first message carries the totals.
 */
export interface WeightsChunk__Output {
  'policy_version': (number);
  'total_bytes': (number);
  'offset': (number);
  'data': (Buffer);
  /**
   * On the last message: SHA-256 (hex) of the whole file, and config.json of the model.
   */
  'sha256': (string);
  'config_json': (string);
  'last': (boolean);
  /**
   * On the first message: set when the requested version is not the one served.
   */
  'note': (string);
  /**
   * What the file is: "model" (model.safetensors; config_json is config.json) or
   * "peft_adapter" (adapter_model.safetensors; config_json is adapter_config.json).
   */
  'format': (string);
  /**
   * with_files: the file this piece belongs to ("" = the weights, always first; then e.g.
   * "tokenizer.json"). Each file has its own offset and total_bytes, and its last piece
   * carries last = true and its sha256; the stream ends after the last file.
   */
  'file': (string);
}
