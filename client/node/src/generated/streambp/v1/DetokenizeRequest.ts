// Original file: ../../proto/streambp/v1/trainer.proto

import type { TokenSequence as _streambp_v1_TokenSequence, TokenSequence__Output as _streambp_v1_TokenSequence__Output } from '../../streambp/v1/TokenSequence';

export interface DetokenizeRequest {
  'sequences'?: (_streambp_v1_TokenSequence)[];
  'skip_special_tokens'?: (boolean);
}

export interface DetokenizeRequest__Output {
  'sequences': (_streambp_v1_TokenSequence__Output)[];
  'skip_special_tokens': (boolean);
}
