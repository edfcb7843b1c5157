// Original file: ../../proto/streambp/v1/trainer.proto


export interface DeleteSnapshotResponse {
  'name'?: (string);
}

export interface DeleteSnapshotResponse__Output {
  'name': (string);
}
