// Original file: ../../proto/streambp/v1/trainer.proto

import type { LoraConfig as _streambp_v1_LoraConfig, LoraConfig__Output as _streambp_v1_LoraConfig__Output } from '../../streambp/v1/LoraConfig';
import type { PeftAdapter as _streambp_v1_PeftAdapter, PeftAdapter__Output as _streambp_v1_PeftAdapter__Output } from '../../streambp/v1/PeftAdapter';
import type { TrainingConfig as _streambp_v1_TrainingConfig, TrainingConfig__Output as _streambp_v1_TrainingConfig__Output } from '../../streambp/v1/TrainingConfig';
import type { RolloutConfig as _streambp_v1_RolloutConfig, RolloutConfig__Output as _streambp_v1_RolloutConfig__Output } from '../../streambp/v1/RolloutConfig';

export interface CreateSessionRequest {
  'request_id'?: (string);
  /**
   * [A-Za-z0-9._-], at most 64 characters, unique
   */
  'name'?: (string);
  /**
   * a new adapter
   */
  'lora'?: (_streambp_v1_LoraConfig | null);
  /**
   * start from an uploaded PEFT adapter
   */
  'adapter'?: (_streambp_v1_PeftAdapter | null);
  /**
   * full fine-tuning of a copy of the base (where allowed)
   */
  'full'?: (boolean);
  'training'?: (_streambp_v1_TrainingConfig | null);
  'rollouts'?: (_streambp_v1_RolloutConfig | null);
  'kind'?: "lora"|"adapter"|"full";
}

export interface CreateSessionRequest__Output {
  'request_id': (string);
  /**
   * [A-Za-z0-9._-], at most 64 characters, unique
   */
  'name': (string);
  /**
   * a new adapter
   */
  'lora'?: (_streambp_v1_LoraConfig__Output | null);
  /**
   * start from an uploaded PEFT adapter
   */
  'adapter'?: (_streambp_v1_PeftAdapter__Output | null);
  /**
   * full fine-tuning of a copy of the base (where allowed)
   */
  'full'?: (boolean);
  'training': (_streambp_v1_TrainingConfig__Output | null);
  'rollouts': (_streambp_v1_RolloutConfig__Output | null);
  'kind'?: "lora"|"adapter"|"full";
}
