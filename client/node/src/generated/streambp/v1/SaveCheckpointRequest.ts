// Original file: ../../proto/streambp/v1/trainer.proto


export interface SaveCheckpointRequest {
  'request_id'?: (string);
  /**
   * A name inside the server's checkpoint directory ([A-Za-z0-9._-], no path).
   * Empty = "step-<step>".
   */
  'name'?: (string);
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session'?: (string);
}

export interface SaveCheckpointRequest__Output {
  'request_id': (string);
  /**
   * A name inside the server's checkpoint directory ([A-Za-z0-9._-], no path).
   * Empty = "step-<step>".
   */
  'name': (string);
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session': (string);
}
