// Original file: ../../proto/streambp/v1/trainer.proto


export interface LoadCheckpointRequest {
  'request_id'?: (string);
  /**
   * empty = the newest complete checkpoint
   */
  'name'?: (string);
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session'?: (string);
}

export interface LoadCheckpointRequest__Output {
  'request_id': (string);
  /**
   * empty = the newest complete checkpoint
   */
  'name': (string);
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session': (string);
}
