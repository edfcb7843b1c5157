// Original file: ../../proto/streambp/v1/trainer.proto

import type { SftBatch as _streambp_v1_SftBatch, SftBatch__Output as _streambp_v1_SftBatch__Output } from '../../streambp/v1/SftBatch';
import type { DpoBatch as _streambp_v1_DpoBatch, DpoBatch__Output as _streambp_v1_DpoBatch__Output } from '../../streambp/v1/DpoBatch';
import type { GrpoBatch as _streambp_v1_GrpoBatch, GrpoBatch__Output as _streambp_v1_GrpoBatch__Output } from '../../streambp/v1/GrpoBatch';
import type { WeightedLogprobsBatch as _streambp_v1_WeightedLogprobsBatch, WeightedLogprobsBatch__Output as _streambp_v1_WeightedLogprobsBatch__Output } from '../../streambp/v1/WeightedLogprobsBatch';
import type { DatumBatch as _streambp_v1_DatumBatch, DatumBatch__Output as _streambp_v1_DatumBatch__Output } from '../../streambp/v1/DatumBatch';

export interface Batch {
  'sft'?: (_streambp_v1_SftBatch | null);
  'dpo'?: (_streambp_v1_DpoBatch | null);
  'grpo'?: (_streambp_v1_GrpoBatch | null);
  /**
   * objective weighted_logprobs
   */
  'weighted'?: (_streambp_v1_WeightedLogprobsBatch | null);
  /**
   * any objective that declares inputs (the objective is required)
   */
  'data'?: (_streambp_v1_DatumBatch | null);
  'kind'?: "sft"|"dpo"|"grpo"|"weighted"|"data";
}

export interface Batch__Output {
  'sft'?: (_streambp_v1_SftBatch__Output | null);
  'dpo'?: (_streambp_v1_DpoBatch__Output | null);
  'grpo'?: (_streambp_v1_GrpoBatch__Output | null);
  /**
   * objective weighted_logprobs
   */
  'weighted'?: (_streambp_v1_WeightedLogprobsBatch__Output | null);
  /**
   * any objective that declares inputs (the objective is required)
   */
  'data'?: (_streambp_v1_DatumBatch__Output | null);
  'kind'?: "sft"|"dpo"|"grpo"|"weighted"|"data";
}
