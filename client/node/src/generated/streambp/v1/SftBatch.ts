// Original file: ../../proto/streambp/v1/trainer.proto

import type { SftExample as _streambp_v1_SftExample, SftExample__Output as _streambp_v1_SftExample__Output } from '../../streambp/v1/SftExample';

export interface SftBatch {
  'examples'?: (_streambp_v1_SftExample)[];
}

export interface SftBatch__Output {
  'examples': (_streambp_v1_SftExample__Output)[];
}
