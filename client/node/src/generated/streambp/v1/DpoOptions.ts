// Original file: ../../proto/streambp/v1/trainer.proto


export interface DpoOptions {
  /**
   * default 0.1
   */
  'beta'?: (number | string);
  /**
   * sigmoid (default) | ipo | hinge | robust
   */
  'loss_type'?: (string);
  /**
   * default 0
   */
  'label_smoothing'?: (number | string);
  /**
   * pairs of the whole step; 0 = this call's pairs
   */
  'normalizer'?: (number | string);
  '_beta'?: "beta";
  '_label_smoothing'?: "label_smoothing";
}

export interface DpoOptions__Output {
  /**
   * default 0.1
   */
  'beta'?: (number);
  /**
   * sigmoid (default) | ipo | hinge | robust
   */
  'loss_type': (string);
  /**
   * default 0
   */
  'label_smoothing'?: (number);
  /**
   * pairs of the whole step; 0 = this call's pairs
   */
  'normalizer': (number);
  '_beta'?: "beta";
  '_label_smoothing'?: "label_smoothing";
}
