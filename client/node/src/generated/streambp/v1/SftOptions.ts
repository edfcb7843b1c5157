// Original file: ../../proto/streambp/v1/trainer.proto


export interface SftOptions {
  /**
   * Selected target tokens of the whole step when a step spans several ForwardBackward
   * calls (so accumulation equals one big batch); 0 = this call's targets.
   */
  'normalizer'?: (number | string);
}

export interface SftOptions__Output {
  /**
   * Selected target tokens of the whole step when a step spans several ForwardBackward
   * calls (so accumulation equals one big batch); 0 = this call's targets.
   */
  'normalizer': (number);
}
