// Original file: ../../proto/streambp/v1/trainer.proto


export interface ListSnapshotsRequest {
  'session'?: (string);
}

export interface ListSnapshotsRequest__Output {
  'session': (string);
}
