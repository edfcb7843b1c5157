// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

export interface StepStats {
  'loss'?: (number | string);
  /**
   * the objective's metrics (e.g. rewards/margins, kl)
   */
  'metrics'?: ({[key: string]: number | string});
  /**
   * non-padding tokens processed
   */
  'tokens'?: (number | string | Long);
  /**
   * target tokens the loss was computed on
   */
  'targets'?: (number | string | Long);
  'sequences'?: (number | string | Long);
  'micro_batches'?: (number | string | Long);
  /**
   * the engine and chunk sizes actually used
   */
  'engine'?: (string);
  'chunk'?: (number | string | Long);
  'logits_chunk'?: (number | string | Long);
  /**
   * peak tracked activation + gradient memory of the step
   */
  'peak_memory_bytes'?: (number | string | Long);
  /**
   * time on the device (queue wait excluded)
   */
  'seconds'?: (number | string);
  /**
   * time waiting in the queue
   */
  'queue_seconds'?: (number | string);
  'key_chunk'?: (number | string | Long);
  /**
   * Bytes the step kept in the second tier (engine.offload_layer_inputs: the stored layer
   * inputs in host memory or the scratch file), not in peak_memory_bytes; 0 = none.
   */
  'offloaded_bytes'?: (number | string | Long);
}

export interface StepStats__Output {
  'loss': (number);
  /**
   * the objective's metrics (e.g. rewards/margins, kl)
   */
  'metrics': ({[key: string]: number});
  /**
   * non-padding tokens processed
   */
  'tokens': (number);
  /**
   * target tokens the loss was computed on
   */
  'targets': (number);
  'sequences': (number);
  'micro_batches': (number);
  /**
   * the engine and chunk sizes actually used
   */
  'engine': (string);
  'chunk': (number);
  'logits_chunk': (number);
  /**
   * peak tracked activation + gradient memory of the step
   */
  'peak_memory_bytes': (number);
  /**
   * time on the device (queue wait excluded)
   */
  'seconds': (number);
  /**
   * time waiting in the queue
   */
  'queue_seconds': (number);
  'key_chunk': (number);
  /**
   * Bytes the step kept in the second tier (engine.offload_layer_inputs: the stored layer
   * inputs in host memory or the scratch file), not in peak_memory_bytes; 0 = none.
   */
  'offloaded_bytes': (number);
}
