// Original file: ../../proto/streambp/v1/trainer.proto


export interface SaveWeightsForSamplerRequest {
  'request_id'?: (string);
  'session'?: (string);
  /**
   * [A-Za-z0-9._-], 1 to 64 characters, not starting with '.'; unique within the session
   * (ALREADY_EXISTS: delete the old one first).
   */
  'name'?: (string);
  /**
   * Removed this many seconds after it is saved; 0 = sessions.snapshot_ttl_seconds (whose 0
   * keeps it until it is deleted).
   */
  'ttl_seconds'?: (number | string);
  /**
   * At the session's bound (sessions.max_snapshots or max_snapshot_bytes), remove its oldest
   * snapshots to make room instead of answering RESOURCE_EXHAUSTED: a rolling window of
   * samplers, as an RL loop that saves every step wants.
   */
  'replace_oldest'?: (boolean);
}

export interface SaveWeightsForSamplerRequest__Output {
  'request_id': (string);
  'session': (string);
  /**
   * [A-Za-z0-9._-], 1 to 64 characters, not starting with '.'; unique within the session
   * (ALREADY_EXISTS: delete the old one first).
   */
  'name': (string);
  /**
   * Removed this many seconds after it is saved; 0 = sessions.snapshot_ttl_seconds (whose 0
   * keeps it until it is deleted).
   */
  'ttl_seconds': (number);
  /**
   * At the session's bound (sessions.max_snapshots or max_snapshot_bytes), remove its oldest
   * snapshots to make room instead of answering RESOURCE_EXHAUSTED: a rolling window of
   * samplers, as an RL loop that saves every step wants.
   */
  'replace_oldest': (boolean);
}
