// Original file: ../../proto/streambp/v1/trainer.proto


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
}
