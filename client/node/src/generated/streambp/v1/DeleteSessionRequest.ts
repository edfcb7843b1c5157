// Original file: ../../proto/streambp/v1/trainer.proto


export interface DeleteSessionRequest {
  'request_id'?: (string);
  'name'?: (string);
}

export interface DeleteSessionRequest__Output {
  'request_id': (string);
  'name': (string);
}
