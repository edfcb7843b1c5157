// Original file: ../../proto/streambp/v1/trainer.proto


/**
 * A value of loss_fn_config: a number, a string or a flag.
 */
export interface ConfigValue {
  'number'?: (number | string);
  'text'?: (string);
  'flag'?: (boolean);
  'value'?: "number"|"text"|"flag";
}

/**
 * A value of loss_fn_config: a number, a string or a flag.
 */
export interface ConfigValue__Output {
  'number'?: (number);
  'text'?: (string);
  'flag'?: (boolean);
  'value'?: "number"|"text"|"flag";
}
