// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

export interface ScheduleConfig {
  /**
   * constant | linear | cosine; "" = the server's
   */
  'type'?: (string);
  'warmup_steps'?: (number | string | Long);
  'total_steps'?: (number | string | Long);
  'min_lr_ratio'?: (number | string);
  '_min_lr_ratio'?: "min_lr_ratio";
}

export interface ScheduleConfig__Output {
  /**
   * constant | linear | cosine; "" = the server's
   */
  'type': (string);
  'warmup_steps': (number);
  'total_steps': (number);
  'min_lr_ratio'?: (number);
  '_min_lr_ratio'?: "min_lr_ratio";
}
