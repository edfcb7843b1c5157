// Original file: ../../proto/streambp/v1/trainer.proto


export interface GetInfoRequest {
  /**
   * "" = the server; a name adds that session's state (SessionInfo)
   */
  'session'?: (string);
}

export interface GetInfoRequest__Output {
  /**
   * "" = the server; a name adds that session's state (SessionInfo)
   */
  'session': (string);
}
