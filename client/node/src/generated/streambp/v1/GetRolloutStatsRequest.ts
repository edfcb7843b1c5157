// Original file: ../../proto/streambp/v1/trainer.proto


export interface GetRolloutStatsRequest {
  'session'?: (string);
}

export interface GetRolloutStatsRequest__Output {
  'session': (string);
}
