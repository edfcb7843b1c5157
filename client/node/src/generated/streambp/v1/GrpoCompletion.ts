// Original file: ../../proto/streambp/v1/trainer.proto

import type { RoutedExperts as _streambp_v1_RoutedExperts, RoutedExperts__Output as _streambp_v1_RoutedExperts__Output } from '../../streambp/v1/RoutedExperts';

export interface GrpoCompletion {
  'tokens'?: (number)[];
  /**
   * Scalar reward (finite). Ignored when advantages are given.
   */
  'reward'?: (number | string);
  /**
   * Optional: the sampler's log-prob of each completion token (same length as tokens).
   */
  'logprobs'?: (number | string)[];
  /**
   * Optional: advantages per completion token, instead of advantages from rewards.
   */
  'advantages'?: (number | string)[];
  /**
   * Instead of tokens: the completion as text (tokenized without special tokens; give
   * logprobs/advantages only if their length matches the tokenization).
   */
  'text'?: (string);
  /**
   * Optional routing replay: the experts of every token of prompt + completion, as Sample's
   * Completion.routed_experts gives them (with token ids, not text).
   */
  'routed_experts'?: (_streambp_v1_RoutedExperts | null);
}

export interface GrpoCompletion__Output {
  'tokens': (number)[];
  /**
   * Scalar reward (finite). Ignored when advantages are given.
   */
  'reward': (number);
  /**
   * Optional: the sampler's log-prob of each completion token (same length as tokens).
   */
  'logprobs': (number)[];
  /**
   * Optional: advantages per completion token, instead of advantages from rewards.
   */
  'advantages': (number)[];
  /**
   * Instead of tokens: the completion as text (tokenized without special tokens; give
   * logprobs/advantages only if their length matches the tokenization).
   */
  'text': (string);
  /**
   * Optional routing replay: the experts of every token of prompt + completion, as Sample's
   * Completion.routed_experts gives them (with token ids, not text).
   */
  'routed_experts': (_streambp_v1_RoutedExperts__Output | null);
}
