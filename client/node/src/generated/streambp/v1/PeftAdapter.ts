// Original file: ../../proto/streambp/v1/trainer.proto


/**
 * A PEFT adapter to start from (the files of a PEFT adapter folder).
 */
export interface PeftAdapter {
  'adapter_config_json'?: (string);
  'adapter_model_safetensors'?: (Buffer | Uint8Array | string);
}

/**
 * A PEFT adapter to start from (the files of a PEFT adapter folder).
 */
export interface PeftAdapter__Output {
  'adapter_config_json': (string);
  'adapter_model_safetensors': (Buffer);
}
