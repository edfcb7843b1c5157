// Original file: ../../proto/streambp/v1/trainer.proto


/**
 * The tokens the model reads (Tinker's ModelInput).
 */
export interface ModelInput {
  'tokens'?: (number)[];
}

/**
 * The tokens the model reads (Tinker's ModelInput).
 */
export interface ModelInput__Output {
  'tokens': (number)[];
}
