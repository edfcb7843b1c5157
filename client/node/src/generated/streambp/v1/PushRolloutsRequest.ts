// Original file: ../../proto/streambp/v1/trainer.proto

import type { RolloutGroup as _streambp_v1_RolloutGroup, RolloutGroup__Output as _streambp_v1_RolloutGroup__Output } from '../../streambp/v1/RolloutGroup';

export interface PushRolloutsRequest {
  'groups'?: (_streambp_v1_RolloutGroup)[];
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session'?: (string);
}

export interface PushRolloutsRequest__Output {
  'groups': (_streambp_v1_RolloutGroup__Output)[];
  /**
   * the session; "" = the default session (servers without sessions)
   */
  'session': (string);
}
