// Original file: ../../proto/streambp/v1/trainer.proto

import type { ForwardBackwardResponse as _streambp_v1_ForwardBackwardResponse, ForwardBackwardResponse__Output as _streambp_v1_ForwardBackwardResponse__Output } from '../../streambp/v1/ForwardBackwardResponse';
import type { TrainStepResponse as _streambp_v1_TrainStepResponse, TrainStepResponse__Output as _streambp_v1_TrainStepResponse__Output } from '../../streambp/v1/TrainStepResponse';
import type { Long } from '@grpc/proto-loader';

/**
 * Progress of one ForwardBackward or TrainStep, in order:
 * queued (with queue_position; repeated as the position changes), started,
 * forward / backward with layer of num_layers, head, optimizer, done.
 * The last message has state "done" and carries the response; an error ends the stream
 * with the same status the unary call would return.
 */
export interface StepProgress {
  'state'?: (string);
  /**
   * queued: requests ahead of this one
   */
  'queue_position'?: (number | string | Long);
  /**
   * forward / backward: the layer being run (0-based)
   */
  'layer'?: (number);
  'num_layers'?: (number);
  /**
   * the micro-batch being run (0-based)
   */
  'micro_batch'?: (number);
  'micro_batches'?: (number);
  /**
   * since the request arrived
   */
  'elapsed_seconds'?: (number | string);
  /**
   * done, ForwardBackwardProgress
   */
  'forward_backward'?: (_streambp_v1_ForwardBackwardResponse | null);
  /**
   * done, TrainStepProgress
   */
  'train_step'?: (_streambp_v1_TrainStepResponse | null);
}

/**
 * Progress of one ForwardBackward or TrainStep, in order:
 * queued (with queue_position; repeated as the position changes), started,
 * forward / backward with layer of num_layers, head, optimizer, done.
 * The last message has state "done" and carries the response; an error ends the stream
 * with the same status the unary call would return.
 */
export interface StepProgress__Output {
  'state': (string);
  /**
   * queued: requests ahead of this one
   */
  'queue_position': (number);
  /**
   * forward / backward: the layer being run (0-based)
   */
  'layer': (number);
  'num_layers': (number);
  /**
   * the micro-batch being run (0-based)
   */
  'micro_batch': (number);
  'micro_batches': (number);
  /**
   * since the request arrived
   */
  'elapsed_seconds': (number);
  /**
   * done, ForwardBackwardProgress
   */
  'forward_backward': (_streambp_v1_ForwardBackwardResponse__Output | null);
  /**
   * done, TrainStepProgress
   */
  'train_step': (_streambp_v1_TrainStepResponse__Output | null);
}
