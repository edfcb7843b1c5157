// Original file: ../../proto/streambp/v1/trainer.proto


export interface OptimStepRequest {
  'request_id'?: (string);
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session'?: (string);
}

export interface OptimStepRequest__Output {
  'request_id': (string);
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session': (string);
}
