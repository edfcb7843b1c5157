// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

export interface SnapshotInfo {
  'session'?: (string);
  'name'?: (string);
  /**
   * the session's optimizer step when it was saved
   */
  'step'?: (number | string | Long);
  /**
   * and its policy version (what Sample reports from it)
   */
  'policy_version'?: (number | string | Long);
  /**
   * on disk (adapter or model, with the optimizer state)
   */
  'bytes'?: (number | string | Long);
  'created_unix'?: (number | string);
  /**
   * 0 = kept until deleted
   */
  'expires_unix'?: (number | string);
  /**
   * held in device memory now
   */
  'resident'?: (boolean);
}

export interface SnapshotInfo__Output {
  'session': (string);
  'name': (string);
  /**
   * the session's optimizer step when it was saved
   */
  'step': (number);
  /**
   * and its policy version (what Sample reports from it)
   */
  'policy_version': (number);
  /**
   * on disk (adapter or model, with the optimizer state)
   */
  'bytes': (number);
  'created_unix': (number);
  /**
   * 0 = kept until deleted
   */
  'expires_unix': (number);
  /**
   * held in device memory now
   */
  'resident': (boolean);
}
