// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

export interface RolloutStats {
  'queue_depth'?: (number | string | Long);
  'accepted'?: (number | string | Long);
  'consumed'?: (number | string | Long);
  'dropped_stale'?: (number | string | Long);
  'duplicates'?: (number | string | Long);
  'invalid'?: (number | string | Long);
  'steps_run'?: (number | string | Long);
  'last_step_seconds'?: (number | string);
  'groups_per_step'?: (number | string | Long);
  'max_staleness'?: (number | string | Long);
  'policy_version'?: (number | string | Long);
}

export interface RolloutStats__Output {
  'queue_depth': (number);
  'accepted': (number);
  'consumed': (number);
  'dropped_stale': (number);
  'duplicates': (number);
  'invalid': (number);
  'steps_run': (number);
  'last_step_seconds': (number);
  'groups_per_step': (number);
  'max_staleness': (number);
  'policy_version': (number);
}
