// Original file: ../../proto/streambp/v1/trainer.proto

import type { StepStats as _streambp_v1_StepStats, StepStats__Output as _streambp_v1_StepStats__Output } from '../../streambp/v1/StepStats';
import type { OptimStepResponse as _streambp_v1_OptimStepResponse, OptimStepResponse__Output as _streambp_v1_OptimStepResponse__Output } from '../../streambp/v1/OptimStepResponse';

export interface TrainStepResponse {
  'stats'?: (_streambp_v1_StepStats | null);
  'optim'?: (_streambp_v1_OptimStepResponse | null);
}

export interface TrainStepResponse__Output {
  'stats': (_streambp_v1_StepStats__Output | null);
  'optim': (_streambp_v1_OptimStepResponse__Output | null);
}
