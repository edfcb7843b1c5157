// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

export interface RolloutAck {
  /**
   * position of the group in the request (or stream)
   */
  'index'?: (number);
  'group_id'?: (string);
  /**
   * accepted | duplicate | stale | invalid
   */
  'status'?: (string);
  /**
   * why, when not accepted
   */
  'message'?: (string);
  /**
   * groups waiting after this one
   */
  'queue_depth'?: (number | string | Long);
  /**
   * current version when acknowledged
   */
  'policy_version'?: (number | string | Long);
}

export interface RolloutAck__Output {
  /**
   * position of the group in the request (or stream)
   */
  'index': (number);
  'group_id': (string);
  /**
   * accepted | duplicate | stale | invalid
   */
  'status': (string);
  /**
   * why, when not accepted
   */
  'message': (string);
  /**
   * groups waiting after this one
   */
  'queue_depth': (number);
  /**
   * current version when acknowledged
   */
  'policy_version': (number);
}
