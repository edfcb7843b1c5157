// Original file: ../../proto/streambp/v1/trainer.proto

import type { OptimizerConfig as _streambp_v1_OptimizerConfig, OptimizerConfig__Output as _streambp_v1_OptimizerConfig__Output } from '../../streambp/v1/OptimizerConfig';
import type { ScheduleConfig as _streambp_v1_ScheduleConfig, ScheduleConfig__Output as _streambp_v1_ScheduleConfig__Output } from '../../streambp/v1/ScheduleConfig';
import type { Long } from '@grpc/proto-loader';

/**
 * How a session trains; unset fields take the server's defaults (its trainer config).
 */
export interface TrainingConfig {
  'optimizer'?: (_streambp_v1_OptimizerConfig | null);
  'schedule'?: (_streambp_v1_ScheduleConfig | null);
  'max_grad_norm'?: (number | string);
  'seed'?: (number | string | Long);
  '_max_grad_norm'?: "max_grad_norm";
}

/**
 * How a session trains; unset fields take the server's defaults (its trainer config).
 */
export interface TrainingConfig__Output {
  'optimizer': (_streambp_v1_OptimizerConfig__Output | null);
  'schedule': (_streambp_v1_ScheduleConfig__Output | null);
  'max_grad_norm'?: (number);
  'seed': (number);
  '_max_grad_norm'?: "max_grad_norm";
}
