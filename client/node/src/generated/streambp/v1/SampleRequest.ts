// Original file: ../../proto/streambp/v1/trainer.proto

import type { TokenSequence as _streambp_v1_TokenSequence, TokenSequence__Output as _streambp_v1_TokenSequence__Output } from '../../streambp/v1/TokenSequence';
import type { Text as _streambp_v1_Text, Text__Output as _streambp_v1_Text__Output } from '../../streambp/v1/Text';
import type { Long } from '@grpc/proto-loader';

export interface SampleRequest {
  'prompts'?: (_streambp_v1_TokenSequence)[];
  /**
   * completions per prompt, default 1
   */
  'n'?: (number);
  /**
   * default 1; 0 = greedy
   */
  'temperature'?: (number | string);
  /**
   * nucleus sampling, default 1 (off)
   */
  'top_p'?: (number | string);
  /**
   * new tokens per completion (required, > 0)
   */
  'max_tokens'?: (number);
  /**
   * a completion ends after producing one of these
   */
  'stop_tokens'?: (number)[];
  /**
   * same seed and policy version -> same samples
   */
  'seed'?: (number | string | Long);
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session'?: (string);
  /**
   * Instead of prompts: text or messages (messages end with the generation prompt).
   */
  'text_prompts'?: (_streambp_v1_Text)[];
  /**
   * By default a completion also ends at the model's end-of-sequence tokens
   * (GetInfo.tokenizer.eos_token_ids, from config.json and generation_config.json).
   */
  'ignore_eos'?: (boolean);
  /**
   * Mixture-of-experts models: return the experts the sampler routed each token to
   * (Completion.routed_experts), for routing replay in training.
   */
  'return_routed_experts'?: (boolean);
  /**
   * A sampler snapshot of the session (SaveWeightsForSampler) instead of its current weights:
   * its weights stay as they were saved while the session trains on.
   */
  'snapshot'?: (string);
  '_temperature'?: "temperature";
  '_top_p'?: "top_p";
  '_seed'?: "seed";
}

export interface SampleRequest__Output {
  'prompts': (_streambp_v1_TokenSequence__Output)[];
  /**
   * completions per prompt, default 1
   */
  'n': (number);
  /**
   * default 1; 0 = greedy
   */
  'temperature'?: (number);
  /**
   * nucleus sampling, default 1 (off)
   */
  'top_p'?: (number);
  /**
   * new tokens per completion (required, > 0)
   */
  'max_tokens': (number);
  /**
   * a completion ends after producing one of these
   */
  'stop_tokens': (number)[];
  /**
   * same seed and policy version -> same samples
   */
  'seed'?: (number);
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session': (string);
  /**
   * Instead of prompts: text or messages (messages end with the generation prompt).
   */
  'text_prompts': (_streambp_v1_Text__Output)[];
  /**
   * By default a completion also ends at the model's end-of-sequence tokens
   * (GetInfo.tokenizer.eos_token_ids, from config.json and generation_config.json).
   */
  'ignore_eos': (boolean);
  /**
   * Mixture-of-experts models: return the experts the sampler routed each token to
   * (Completion.routed_experts), for routing replay in training.
   */
  'return_routed_experts': (boolean);
  /**
   * A sampler snapshot of the session (SaveWeightsForSampler) instead of its current weights:
   * its weights stay as they were saved while the session trains on.
   */
  'snapshot': (string);
  '_temperature'?: "temperature";
  '_top_p'?: "top_p";
  '_seed'?: "seed";
}
