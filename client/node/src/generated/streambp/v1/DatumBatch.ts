// Original file: ../../proto/streambp/v1/trainer.proto

import type { Datum as _streambp_v1_Datum, Datum__Output as _streambp_v1_Datum__Output } from '../../streambp/v1/Datum';

export interface DatumBatch {
  'data'?: (_streambp_v1_Datum)[];
}

export interface DatumBatch__Output {
  'data': (_streambp_v1_Datum__Output)[];
}
