// Original file: ../../proto/streambp/v1/trainer.proto


export interface DeleteSessionResponse {
  'name'?: (string);
}

export interface DeleteSessionResponse__Output {
  'name': (string);
}
