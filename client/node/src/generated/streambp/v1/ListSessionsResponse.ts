// Original file: ../../proto/streambp/v1/trainer.proto

import type { SessionInfo as _streambp_v1_SessionInfo, SessionInfo__Output as _streambp_v1_SessionInfo__Output } from '../../streambp/v1/SessionInfo';
import type { Long } from '@grpc/proto-loader';

export interface ListSessionsResponse {
  /**
   * those the caller may see
   */
  'sessions'?: (_streambp_v1_SessionInfo)[];
  'max_sessions'?: (number | string | Long);
  'max_resident_sessions'?: (number | string | Long);
}

export interface ListSessionsResponse__Output {
  /**
   * those the caller may see
   */
  'sessions': (_streambp_v1_SessionInfo__Output)[];
  'max_sessions': (number);
  'max_resident_sessions': (number);
}
