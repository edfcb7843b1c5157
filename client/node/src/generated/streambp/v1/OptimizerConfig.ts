// Original file: ../../proto/streambp/v1/trainer.proto


export interface OptimizerConfig {
  /**
   * adamw | sgd; "" = the server's
   */
  'name'?: (string);
  'lr'?: (number | string);
  'beta1'?: (number | string);
  'beta2'?: (number | string);
  'eps'?: (number | string);
  'weight_decay'?: (number | string);
  /**
   * sgd
   */
  'momentum'?: (number | string);
  '_lr'?: "lr";
  '_beta1'?: "beta1";
  '_beta2'?: "beta2";
  '_eps'?: "eps";
  '_weight_decay'?: "weight_decay";
  '_momentum'?: "momentum";
}

export interface OptimizerConfig__Output {
  /**
   * adamw | sgd; "" = the server's
   */
  'name': (string);
  'lr'?: (number);
  'beta1'?: (number);
  'beta2'?: (number);
  'eps'?: (number);
  'weight_decay'?: (number);
  /**
   * sgd
   */
  'momentum'?: (number);
  '_lr'?: "lr";
  '_beta1'?: "beta1";
  '_beta2'?: "beta2";
  '_eps'?: "eps";
  '_weight_decay'?: "weight_decay";
  '_momentum'?: "momentum";
}
