// Original file: ../../proto/streambp/v1/trainer.proto

import type { Long } from '@grpc/proto-loader';

/**
 * Counters since the server (or the session) started; every pushed group lands in exactly
 * one of accepted, dropped_stale (refused at the push), duplicates and invalid, and every
 * accepted group later in consumed or dropped_stale (dropped from the queue), or is in_step
 * or still queued. Groups acknowledged "retry" are counted nowhere: they were not taken.
 */
export interface RolloutStats {
  /**
   * groups waiting to be trained
   */
  'queue_depth'?: (number | string | Long);
  /**
   * groups acknowledged "accepted"
   */
  'accepted'?: (number | string | Long);
  /**
   * accepted groups trained by a rollout step
   */
  'consumed'?: (number | string | Long);
  /**
   * groups older than policy_version - max_staleness: refused at the push ("stale") or dropped from the queue before a step
   */
  'dropped_stale'?: (number | string | Long);
  /**
   * pushes of a group_id seen before (not trained twice)
   */
  'duplicates'?: (number | string | Long);
  /**
   * groups refused as malformed
   */
  'invalid'?: (number | string | Long);
  /**
   * rollout steps run
   */
  'steps_run'?: (number | string | Long);
  /**
   * wall time of the last rollout step
   */
  'last_step_seconds'?: (number | string);
  /**
   * rollouts.groups_per_step
   */
  'groups_per_step'?: (number | string | Long);
  /**
   * rollouts.max_staleness
   */
  'max_staleness'?: (number | string | Long);
  /**
   * the current policy version
   */
  'policy_version'?: (number | string | Long);
  /**
   * groups taken by the running rollout step (consumed when it commits)
   */
  'in_step'?: (number | string | Long);
}

/**
 * Counters since the server (or the session) started; every pushed group lands in exactly
 * one of accepted, dropped_stale (refused at the push), duplicates and invalid, and every
 * accepted group later in consumed or dropped_stale (dropped from the queue), or is in_step
 * or still queued. Groups acknowledged "retry" are counted nowhere: they were not taken.
 */
export interface RolloutStats__Output {
  /**
   * groups waiting to be trained
   */
  'queue_depth': (number);
  /**
   * groups acknowledged "accepted"
   */
  'accepted': (number);
  /**
   * accepted groups trained by a rollout step
   */
  'consumed': (number);
  /**
   * groups older than policy_version - max_staleness: refused at the push ("stale") or dropped from the queue before a step
   */
  'dropped_stale': (number);
  /**
   * pushes of a group_id seen before (not trained twice)
   */
  'duplicates': (number);
  /**
   * groups refused as malformed
   */
  'invalid': (number);
  /**
   * rollout steps run
   */
  'steps_run': (number);
  /**
   * wall time of the last rollout step
   */
  'last_step_seconds': (number);
  /**
   * rollouts.groups_per_step
   */
  'groups_per_step': (number);
  /**
   * rollouts.max_staleness
   */
  'max_staleness': (number);
  /**
   * the current policy version
   */
  'policy_version': (number);
  /**
   * groups taken by the running rollout step (consumed when it commits)
   */
  'in_step': (number);
}
