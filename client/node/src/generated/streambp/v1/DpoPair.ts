// Original file: ../../proto/streambp/v1/trainer.proto

import type { Text as _streambp_v1_Text, Text__Output as _streambp_v1_Text__Output } from '../../streambp/v1/Text';

/**
 * A preference pair. The loss is on the completions (chosen, rejected) after the prompt.
 * Text instead of ids: prompt_text, chosen_text and rejected_text (strings, or
 * conversations: the prompt's messages, then the chosen / rejected assistant messages).
 */
export interface DpoPair {
  'prompt'?: (number)[];
  'chosen'?: (number)[];
  'rejected'?: (number)[];
  /**
   * Reference log-probs of the completions (summed over their tokens). Give both or
   * neither; when absent the server computes them with its frozen reference model.
   */
  'ref_chosen_logp'?: (number | string);
  'ref_rejected_logp'?: (number | string);
  'prompt_text'?: (_streambp_v1_Text | null);
  'chosen_text'?: (_streambp_v1_Text | null);
  'rejected_text'?: (_streambp_v1_Text | null);
  '_ref_chosen_logp'?: "ref_chosen_logp";
  '_ref_rejected_logp'?: "ref_rejected_logp";
}

/**
 * A preference pair. The loss is on the completions (chosen, rejected) after the prompt.
 * Text instead of ids: prompt_text, chosen_text and rejected_text (strings, or
 * conversations: the prompt's messages, then the chosen / rejected assistant messages).
 */
export interface DpoPair__Output {
  'prompt': (number)[];
  'chosen': (number)[];
  'rejected': (number)[];
  /**
   * Reference log-probs of the completions (summed over their tokens). Give both or
   * neither; when absent the server computes them with its frozen reference model.
   */
  'ref_chosen_logp'?: (number);
  'ref_rejected_logp'?: (number);
  'prompt_text': (_streambp_v1_Text__Output | null);
  'chosen_text': (_streambp_v1_Text__Output | null);
  'rejected_text': (_streambp_v1_Text__Output | null);
  '_ref_chosen_logp'?: "ref_chosen_logp";
  '_ref_rejected_logp'?: "ref_rejected_logp";
}
