// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

export interface LoadCheckpointResponse {
  'name'?: (string);
  'step'?: (number | string | Long);
  'policy_version'?: (number | string | Long);
}

export interface LoadCheckpointResponse__Output {
  'name': (string);
  'step': (number);
  'policy_version': (number);
}
