// Original file: ../../proto/streambp/v1/trainer.proto

import type { ModelInput as _streambp_v1_ModelInput, ModelInput__Output as _streambp_v1_ModelInput__Output } from '../../streambp/v1/ModelInput';
import type { TensorData as _streambp_v1_TensorData, TensorData__Output as _streambp_v1_TensorData__Output } from '../../streambp/v1/TensorData';

/**
 * One example for a loss function named by the request's objective (Tinker's Datum). With N
 * = len(model_input.tokens), every per-token tensor of loss_fn_inputs has N entries, entry t
 * about the prediction at position t, i.e. of target_tokens[t]:
 * target_tokens  int_data, required (but for a text model input): the token each
 * position predicts. It is the input
 * shifted by one (target_tokens[t] = model_input.tokens[t+1] for t < N-1);
 * its last entry is the token after the input. cross_entropy also takes
 * shape [N, K]: K candidate tokens per position (a teacher's top-k, for
 * distillation; any ids), with weights of shape [N, K]; each candidate
 * counts as a token against limits.max_tokens_per_request.
 * others         float_data, the names the loss declares (GetInfo.objectives[].inputs):
 * weights (cross_entropy, where it may be left out: every target weighs 1;
 * weighted_logprobs); logprobs (the sampler's) and
 * advantages (importance_sampling, ppo, cispo, dro); or a custom loss's own.
 */
export interface Datum {
  'model_input'?: (_streambp_v1_ModelInput | null);
  'loss_fn_inputs'?: ({[key: string]: _streambp_v1_TensorData});
}

/**
 * One example for a loss function named by the request's objective (Tinker's Datum). With N
 * = len(model_input.tokens), every per-token tensor of loss_fn_inputs has N entries, entry t
 * about the prediction at position t, i.e. of target_tokens[t]:
 * target_tokens  int_data, required (but for a text model input): the token each
 * position predicts. It is the input
 * shifted by one (target_tokens[t] = model_input.tokens[t+1] for t < N-1);
 * its last entry is the token after the input. cross_entropy also takes
 * shape [N, K]: K candidate tokens per position (a teacher's top-k, for
 * distillation; any ids), with weights of shape [N, K]; each candidate
 * counts as a token against limits.max_tokens_per_request.
 * others         float_data, the names the loss declares (GetInfo.objectives[].inputs):
 * weights (cross_entropy, where it may be left out: every target weighs 1;
 * weighted_logprobs); logprobs (the sampler's) and
 * advantages (importance_sampling, ppo, cispo, dro); or a custom loss's own.
 */
export interface Datum__Output {
  'model_input': (_streambp_v1_ModelInput__Output | null);
  'loss_fn_inputs': ({[key: string]: _streambp_v1_TensorData__Output});
}
