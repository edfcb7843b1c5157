// Original file: ../../proto/streambp/v1/trainer.proto


export interface SequenceLogprobs {
  /**
   * logprobs[i] = log p(tokens[i+1] | tokens[..i]): one fewer than the tokens.
   */
  'logprobs'?: (number | string)[];
  /**
   * the same in double precision, when fp64 was asked for
   */
  'logprobs_fp64'?: (number | string)[];
  /**
   * top_k: position i (the one predicting tokens[i+1]) owns entries [i*k, (i+1)*k), most likely
   * first; the log-probs in double precision.
   */
  'top_ids'?: (number)[];
  'top_logprobs'?: (number | string)[];
}

export interface SequenceLogprobs__Output {
  /**
   * logprobs[i] = log p(tokens[i+1] | tokens[..i]): one fewer than the tokens.
   */
  'logprobs': (number)[];
  /**
   * the same in double precision, when fp64 was asked for
   */
  'logprobs_fp64': (number)[];
  /**
   * top_k: position i (the one predicting tokens[i+1]) owns entries [i*k, (i+1)*k), most likely
   * first; the log-probs in double precision.
   */
  'top_ids': (number)[];
  'top_logprobs': (number)[];
}
