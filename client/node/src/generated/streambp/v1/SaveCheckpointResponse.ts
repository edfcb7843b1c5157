// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

export interface SaveCheckpointResponse {
  'name'?: (string);
  'step'?: (number | string | Long);
  'policy_version'?: (number | string | Long);
  'bytes'?: (number | string | Long);
}

export interface SaveCheckpointResponse__Output {
  'name': (string);
  'step': (number);
  'policy_version': (number);
  'bytes': (number);
}
