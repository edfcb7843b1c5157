// Original file: ../../proto/streambp/v1/trainer.proto


export interface TokenizedText {
  'ids'?: (number)[];
  /**
   * Messages: 1 on the tokens of trained assistant messages, else 0. Text: empty.
   */
  'loss_mask'?: (number)[];
  /**
   * messages: the rendered text
   */
  'text'?: (string);
}

export interface TokenizedText__Output {
  'ids': (number)[];
  /**
   * Messages: 1 on the tokens of trained assistant messages, else 0. Text: empty.
   */
  'loss_mask': (number)[];
  /**
   * messages: the rendered text
   */
  'text': (string);
}
