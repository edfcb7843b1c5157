import * as grpc from '@grpc/grpc-js';
import { StreambpError } from './errors';

/**
 * Retries of one logical call: UNAVAILABLE only (the request did not reach the server or
 * the connection broke), with exponential backoff and jitter. The wait before retry k
 * (k = 1 after the first attempt) is
 *   min(initialBackoffSeconds * multiplier^(k-1), maxBackoffSeconds) * (1 + jitter * (2u - 1))
 * for u uniform in [0, 1). All attempts share the call's deadline: no retry starts after it.
 * Mutating calls are safe to repeat because every attempt carries the same request_id.
 */
export interface RetryPolicy {
  /** Attempts in all, >= 1 (1 = no retries). */
  maxAttempts: number;
  /** Wait before the first retry. */
  initialBackoffSeconds: number;
  /** Cap of the exponential schedule. */
  maxBackoffSeconds: number;
  /** Growth of the wait per retry, >= 1. */
  multiplier: number;
  /** Relative spread of each wait, in [0, 1]. */
  jitter: number;
}

export const DEFAULT_RETRY: Readonly<RetryPolicy> = Object.freeze({
  maxAttempts: 5,
  initialBackoffSeconds: 0.2,
  maxBackoffSeconds: 5,
  multiplier: 2,
  jitter: 0.2,
});

/** The policy with defaults filled in; INVALID_ARGUMENT naming the bad field. */
export function retryPolicy(partial: Partial<RetryPolicy> | undefined, base: RetryPolicy = DEFAULT_RETRY): RetryPolicy {
  const p = { ...base, ...partial };
  const bad = (field: string, why: string): never => {
    throw new StreambpError(grpc.status.INVALID_ARGUMENT, `retry.${field} = ${String(p[field as keyof RetryPolicy])} ${why}`);
  };
  if (!Number.isInteger(p.maxAttempts) || p.maxAttempts < 1) bad('maxAttempts', 'must be an integer >= 1');
  if (!(p.initialBackoffSeconds >= 0)) bad('initialBackoffSeconds', 'must be >= 0');
  if (!(p.maxBackoffSeconds >= p.initialBackoffSeconds)) bad('maxBackoffSeconds', 'must be >= initialBackoffSeconds');
  if (!(p.multiplier >= 1)) bad('multiplier', 'must be >= 1');
  if (!(p.jitter >= 0 && p.jitter <= 1)) bad('jitter', 'must be in [0, 1]');
  return p;
}

/** Seconds to wait before retry `retry` (1-based) for a uniform sample `u` in [0, 1). */
export function backoffSeconds(policy: RetryPolicy, retry: number, u: number): number {
  const base = Math.min(policy.initialBackoffSeconds * policy.multiplier ** (retry - 1), policy.maxBackoffSeconds);
  return base * (1 + policy.jitter * (2 * u - 1));
}

/** Whether a failed attempt with this code is retried. */
export function isRetryable(code: grpc.status): boolean {
  return code === grpc.status.UNAVAILABLE;
}
