// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

/**
 * A tensor as a flat list in row-major order (Tinker's TensorData): float values in
 * float_data (float64 on the wire), integers (token ids) in int_data; shape empty = one
 * dimension of the data's length.
 */
export interface TensorData {
  'float_data'?: (number | string)[];
  'int_data'?: (number | string | Long)[];
  'shape'?: (number | string | Long)[];
}

/**
 * A tensor as a flat list in row-major order (Tinker's TensorData): float values in
 * float_data (float64 on the wire), integers (token ids) in int_data; shape empty = one
 * dimension of the data's length.
 */
export interface TensorData__Output {
  'float_data': (number)[];
  'int_data': (number)[];
  'shape': (number)[];
}
