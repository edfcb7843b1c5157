// Original file: ../../proto/streambp/v1/trainer.proto

import type { RolloutAck as _streambp_v1_RolloutAck, RolloutAck__Output as _streambp_v1_RolloutAck__Output } from '../../streambp/v1/RolloutAck';

export interface PushRolloutsResponse {
  'acks'?: (_streambp_v1_RolloutAck)[];
}

export interface PushRolloutsResponse__Output {
  'acks': (_streambp_v1_RolloutAck__Output)[];
}
