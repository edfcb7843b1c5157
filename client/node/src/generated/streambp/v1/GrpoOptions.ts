// Original file: ../../proto/streambp/v1/trainer.proto


export interface GrpoOptions {
  /**
   * k3 KL weight, default 0 (no reference needed)
   */
  'beta'?: (number | string);
  /**
   * default 0.2
   */
  'epsilon_low'?: (number | string);
  /**
   * default 0.28
   */
  'epsilon_high'?: (number | string);
  /**
   * grpo | bnpo | dr_grpo | dapo (default)
   */
  'loss_type'?: (string);
  /**
   * group (default) | batch | none
   */
  'scale_rewards'?: (string);
  /**
   * token (default) | sequence (GSPO)
   */
  'importance_sampling_level'?: (string);
  /**
   * default 1
   */
  'temperature'?: (number | string);
  /**
   * current (default) | sampler
   */
  'old_logprobs'?: (string);
  /**
   * truncated importance sampling cap, default 2; 0 = off
   */
  'tis_cap'?: (number | string);
  /**
   * dr_grpo; 0 = longest completion of the step
   */
  'max_completion_length'?: (number | string);
  /**
   * 0 = computed from this call
   */
  'normalizer'?: (number | string);
  /**
   * report the mean token entropy, default true
   */
  'entropy'?: (boolean);
  '_beta'?: "beta";
  '_epsilon_low'?: "epsilon_low";
  '_epsilon_high'?: "epsilon_high";
  '_temperature'?: "temperature";
  '_tis_cap'?: "tis_cap";
  '_entropy'?: "entropy";
}

export interface GrpoOptions__Output {
  /**
   * k3 KL weight, default 0 (no reference needed)
   */
  'beta'?: (number);
  /**
   * default 0.2
   */
  'epsilon_low'?: (number);
  /**
   * default 0.28
   */
  'epsilon_high'?: (number);
  /**
   * grpo | bnpo | dr_grpo | dapo (default)
   */
  'loss_type': (string);
  /**
   * group (default) | batch | none
   */
  'scale_rewards': (string);
  /**
   * token (default) | sequence (GSPO)
   */
  'importance_sampling_level': (string);
  /**
   * default 1
   */
  'temperature'?: (number);
  /**
   * current (default) | sampler
   */
  'old_logprobs': (string);
  /**
   * truncated importance sampling cap, default 2; 0 = off
   */
  'tis_cap'?: (number);
  /**
   * dr_grpo; 0 = longest completion of the step
   */
  'max_completion_length': (number);
  /**
   * 0 = computed from this call
   */
  'normalizer': (number);
  /**
   * report the mean token entropy, default true
   */
  'entropy'?: (boolean);
  '_beta'?: "beta";
  '_epsilon_low'?: "epsilon_low";
  '_epsilon_high'?: "epsilon_high";
  '_temperature'?: "temperature";
  '_tis_cap'?: "tis_cap";
  '_entropy'?: "entropy";
}
