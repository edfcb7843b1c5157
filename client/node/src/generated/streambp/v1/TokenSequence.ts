// Original file: ../../proto/streambp/v1/trainer.proto


export interface TokenSequence {
  'tokens'?: (number)[];
}

export interface TokenSequence__Output {
  'tokens': (number)[];
}
