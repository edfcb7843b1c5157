// Original file: ../../proto/streambp/v1/trainer.proto

import type { HistoryRecord as _streambp_v1_HistoryRecord, HistoryRecord__Output as _streambp_v1_HistoryRecord__Output } from '../../streambp/v1/HistoryRecord';
import type { Long } from '@grpc/proto-loader';

export interface GetHistoryResponse {
  'records'?: (_streambp_v1_HistoryRecord)[];
  /**
   * the oldest record the server keeps (history.max_records); 0: none
   */
  'first_index'?: (number | string | Long);
  /**
   * the newest; more to read while the last record's index is below it
   */
  'last_index'?: (number | string | Long);
  /**
   * the metrics.jsonl on the server, "" when not written
   */
  'file'?: (string);
}

export interface GetHistoryResponse__Output {
  'records': (_streambp_v1_HistoryRecord__Output)[];
  /**
   * the oldest record the server keeps (history.max_records); 0: none
   */
  'first_index': (number);
  /**
   * the newest; more to read while the last record's index is below it
   */
  'last_index': (number);
  /**
   * the metrics.jsonl on the server, "" when not written
   */
  'file': (string);
}
