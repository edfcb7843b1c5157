// Original file: ../../proto/streambp/v1/trainer.proto


export interface DeleteSnapshotRequest {
  'request_id'?: (string);
  'session'?: (string);
  'name'?: (string);
}

export interface DeleteSnapshotRequest__Output {
  'request_id': (string);
  'session': (string);
  'name': (string);
}
