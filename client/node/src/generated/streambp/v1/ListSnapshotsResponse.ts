// Original file: ../../proto/streambp/v1/trainer.proto

import type { SnapshotInfo as _streambp_v1_SnapshotInfo, SnapshotInfo__Output as _streambp_v1_SnapshotInfo__Output } from '../../streambp/v1/SnapshotInfo';
import type { Long } from '@grpc/proto-loader';

export interface ListSnapshotsResponse {
  /**
   * oldest first
   */
  'snapshots'?: (_streambp_v1_SnapshotInfo)[];
  /**
   * per session
   */
  'max_snapshots'?: (number | string | Long);
  /**
   * per session, all its snapshots together
   */
  'max_snapshot_bytes'?: (number | string | Long);
}

export interface ListSnapshotsResponse__Output {
  /**
   * oldest first
   */
  'snapshots': (_streambp_v1_SnapshotInfo__Output)[];
  /**
   * per session
   */
  'max_snapshots': (number);
  /**
   * per session, all its snapshots together
   */
  'max_snapshot_bytes': (number);
}
