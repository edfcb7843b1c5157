// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

export interface ExportWeightsRequest {
  /**
   * Maximum bytes of data per message (at most 4 MiB; default 4 MiB - 64 KiB, so that each
   * message fits a gRPC client's default 4 MiB receive limit).
   */
  'max_chunk_bytes'?: (number | string | Long);
  /**
   * The policy version wanted (0 = current). The server always serves the current
   * weights; when they are not this version, WeightsChunk.note says so.
   */
  'version'?: (number | string | Long);
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session'?: (string);
  /**
   * An adapter session exports its PEFT adapter (megabytes); merged = true exports the
   * base with the adapter folded in (W + s B A) as a whole model instead.
   */
  'merged'?: (boolean);
  /**
   * After the weights, the model folder's other files (tokenizer.json, tokenizer_config.json,
   * special_tokens_map.json, generation_config.json, chat_template.jinja, ...), so that the
   * exported folder loads in transformers / vLLM as is. See WeightsChunk.file.
   */
  'with_files'?: (boolean);
  /**
   * A sampler snapshot of the session (SaveWeightsForSampler): its PEFT adapter (or merged
   * model) as saved, for vLLM or SGLang.
   */
  'snapshot'?: (string);
}

export interface ExportWeightsRequest__Output {
  /**
   * Maximum bytes of data per message (at most 4 MiB; default 4 MiB - 64 KiB, so that each
   * message fits a gRPC client's default 4 MiB receive limit).
   */
  'max_chunk_bytes': (number);
  /**
   * The policy version wanted (0 = current). The server always serves the current
   * weights; when they are not this version, WeightsChunk.note says so.
   */
  'version': (number);
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session': (string);
  /**
   * An adapter session exports its PEFT adapter (megabytes); merged = true exports the
   * base with the adapter folded in (W + s B A) as a whole model instead.
   */
  'merged': (boolean);
  /**
   * After the weights, the model folder's other files (tokenizer.json, tokenizer_config.json,
   * special_tokens_map.json, generation_config.json, chat_template.jinja, ...), so that the
   * exported folder loads in transformers / vLLM as is. See WeightsChunk.file.
   */
  'with_files': (boolean);
  /**
   * A sampler snapshot of the session (SaveWeightsForSampler): its PEFT adapter (or merged
   * model) as saved, for vLLM or SGLang.
   */
  'snapshot': (string);
}
