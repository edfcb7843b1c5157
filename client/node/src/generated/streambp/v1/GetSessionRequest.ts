// Original file: ../../proto/streambp/v1/trainer.proto


export interface GetSessionRequest {
  'name'?: (string);
}

export interface GetSessionRequest__Output {
  'name': (string);
}
