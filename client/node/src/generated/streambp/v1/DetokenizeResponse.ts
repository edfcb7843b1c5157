// Original file: ../../proto/streambp/v1/trainer.proto


export interface DetokenizeResponse {
  'texts'?: (string)[];
}

export interface DetokenizeResponse__Output {
  'texts': (string)[];
}
