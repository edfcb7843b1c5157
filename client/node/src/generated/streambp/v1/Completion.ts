// Original file: ../../proto/streambp/v1/trainer.proto

import type { RoutedExperts as _streambp_v1_RoutedExperts, RoutedExperts__Output as _streambp_v1_RoutedExperts__Output } from '../../streambp/v1/RoutedExperts';

export interface Completion {
  'prompt_index'?: (number);
  'tokens'?: (number)[];
  /**
   * log p(token) under the sampling distribution before top-p truncation, i.e.
   * log_softmax(logits / temperature): what ComputeLogprobs returns at that temperature.
   */
  'logprobs'?: (number | string)[];
  /**
   * "stop" | "length"
   */
  'finish_reason'?: (string);
  /**
   * The completion decoded (special tokens skipped) when the model has a tokenizer.
   */
  'text'?: (string);
  /**
   * With return_routed_experts: the experts of every token of prompt + completion as the
   * sampler routed them (the last token, never fed to the model, is -1: the router's choice).
   * Put it on the GrpoCompletion / rollout of this completion to replay it in training.
   */
  'routed_experts'?: (_streambp_v1_RoutedExperts | null);
}

export interface Completion__Output {
  'prompt_index': (number);
  'tokens': (number)[];
  /**
   * log p(token) under the sampling distribution before top-p truncation, i.e.
   * log_softmax(logits / temperature): what ComputeLogprobs returns at that temperature.
   */
  'logprobs': (number)[];
  /**
   * "stop" | "length"
   */
  'finish_reason': (string);
  /**
   * The completion decoded (special tokens skipped) when the model has a tokenizer.
   */
  'text': (string);
  /**
   * With return_routed_experts: the experts of every token of prompt + completion as the
   * sampler routed them (the last token, never fed to the model, is -1: the router's choice).
   * Put it on the GrpoCompletion / rollout of this completion to replay it in training.
   */
  'routed_experts': (_streambp_v1_RoutedExperts__Output | null);
}
