// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

export interface WatchPolicyRequest {
  /**
   * updates with version > since_version
   */
  'since_version'?: (number | string | Long);
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session'?: (string);
}

export interface WatchPolicyRequest__Output {
  /**
   * updates with version > since_version
   */
  'since_version': (number);
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session': (string);
}
