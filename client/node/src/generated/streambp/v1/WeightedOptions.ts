// Original file: ../../proto/streambp/v1/trainer.proto


export interface WeightedOptions {
  /**
   * log p of logits / temperature, default 1
   */
  'temperature'?: (number | string);
  '_temperature'?: "temperature";
}

export interface WeightedOptions__Output {
  /**
   * log p of logits / temperature, default 1
   */
  'temperature'?: (number);
  '_temperature'?: "temperature";
}
