// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

export interface GetHistoryRequest {
  'session'?: (string);
  /**
   * records with a larger index (0: from the oldest kept)
   */
  'after_index'?: (number | string | Long);
  /**
   * at most this many (0: all kept, at most 10000 per answer)
   */
  'max_records'?: (number);
}

export interface GetHistoryRequest__Output {
  'session': (string);
  /**
   * records with a larger index (0: from the oldest kept)
   */
  'after_index': (number);
  /**
   * at most this many (0: all kept, at most 10000 per answer)
   */
  'max_records': (number);
}
