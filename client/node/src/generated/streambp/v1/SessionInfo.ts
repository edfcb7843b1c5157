// Original file: ../../proto/streambp/v1/trainer.proto

import type { LoraConfig as _streambp_v1_LoraConfig, LoraConfig__Output as _streambp_v1_LoraConfig__Output } from '../../streambp/v1/LoraConfig';
import type { Long } from '@grpc/proto-loader';

export interface SessionInfo {
  'name'?: (string);
  /**
   * lora | full
   */
  'kind'?: (string);
  'lora'?: (_streambp_v1_LoraConfig | null);
  'step'?: (number | string | Long);
  'policy_version'?: (number | string | Long);
  /**
   * held in device memory (else written to disk until used)
   */
  'resident'?: (boolean);
  'trainable_parameters'?: (number | string | Long);
  /**
   * adapter (or model) + optimizer state while resident
   */
  'device_bytes'?: (number | string | Long);
  'idle_seconds'?: (number | string);
  'pending_micro_batches'?: (number | string | Long);
  'optimizer'?: (string);
  'learning_rate'?: (number | string);
  'groups_per_step'?: (number | string | Long);
  'max_staleness'?: (number | string | Long);
}

export interface SessionInfo__Output {
  'name': (string);
  /**
   * lora | full
   */
  'kind': (string);
  'lora': (_streambp_v1_LoraConfig__Output | null);
  'step': (number);
  'policy_version': (number);
  /**
   * held in device memory (else written to disk until used)
   */
  'resident': (boolean);
  'trainable_parameters': (number);
  /**
   * adapter (or model) + optimizer state while resident
   */
  'device_bytes': (number);
  'idle_seconds': (number);
  'pending_micro_batches': (number);
  'optimizer': (string);
  'learning_rate': (number);
  'groups_per_step': (number);
  'max_staleness': (number);
}
