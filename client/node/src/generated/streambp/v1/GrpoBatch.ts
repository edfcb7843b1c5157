// Original file: ../../proto/streambp/v1/trainer.proto

import type { GrpoGroup as _streambp_v1_GrpoGroup, GrpoGroup__Output as _streambp_v1_GrpoGroup__Output } from '../../streambp/v1/GrpoGroup';

export interface GrpoBatch {
  'groups'?: (_streambp_v1_GrpoGroup)[];
}

export interface GrpoBatch__Output {
  'groups': (_streambp_v1_GrpoGroup__Output)[];
}
