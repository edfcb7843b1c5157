// Original file: ../../proto/streambp/v1/trainer.proto

import type { DpoPair as _streambp_v1_DpoPair, DpoPair__Output as _streambp_v1_DpoPair__Output } from '../../streambp/v1/DpoPair';

export interface DpoBatch {
  'pairs'?: (_streambp_v1_DpoPair)[];
}

export interface DpoBatch__Output {
  'pairs': (_streambp_v1_DpoPair__Output)[];
}
