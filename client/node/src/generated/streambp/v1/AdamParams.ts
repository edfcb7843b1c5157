// Original file: ../../proto/streambp/v1/trainer.proto


/**
 * Tinker's AdamParams; a field left unset takes Tinker's default (in brackets).
 */
export interface AdamParams {
  /**
   * [1e-4] this step's learning rate; no schedule applies
   */
  'learning_rate'?: (number | string);
  /**
   * [0.9]
   */
  'beta1'?: (number | string);
  /**
   * [0.95]
   */
  'beta2'?: (number | string);
  /**
   * [1e-12]
   */
  'eps'?: (number | string);
  /**
   * [0] decoupled, as AdamW: p *= 1 - lr * weight_decay
   */
  'weight_decay'?: (number | string);
  /**
   * [0] clip the gradient's global L2 norm to this; 0 = no clipping
   */
  'grad_clip_norm'?: (number | string);
  '_learning_rate'?: "learning_rate";
  '_beta1'?: "beta1";
  '_beta2'?: "beta2";
  '_eps'?: "eps";
  '_weight_decay'?: "weight_decay";
  '_grad_clip_norm'?: "grad_clip_norm";
}

/**
 * Tinker's AdamParams; a field left unset takes Tinker's default (in brackets).
 */
export interface AdamParams__Output {
  /**
   * [1e-4] this step's learning rate; no schedule applies
   */
  'learning_rate'?: (number);
  /**
   * [0.9]
   */
  'beta1'?: (number);
  /**
   * [0.95]
   */
  'beta2'?: (number);
  /**
   * [1e-12]
   */
  'eps'?: (number);
  /**
   * [0] decoupled, as AdamW: p *= 1 - lr * weight_decay
   */
  'weight_decay'?: (number);
  /**
   * [0] clip the gradient's global L2 norm to this; 0 = no clipping
   */
  'grad_clip_norm'?: (number);
  '_learning_rate'?: "learning_rate";
  '_beta1'?: "beta1";
  '_beta2'?: "beta2";
  '_eps'?: "eps";
  '_weight_decay'?: "weight_decay";
  '_grad_clip_norm'?: "grad_clip_norm";
}
