import * as grpc from '@grpc/grpc-js';
import { StreambpError } from './errors';

/**
 * Retries of UNAVAILABLE (the request did not reach the server or the connection broke),
 * done by @grpc/grpc-js itself: the policy becomes the channel's service-config
 * `retryPolicy`, so a retry re-sends the same request bytes and a mutating call keeps its
 * request_id (the server applies it once). Attempt k + 1 starts after a random wait in
 * [0, min(initialBackoffSeconds * multiplier^(k-1), maxBackoffSeconds)]; all attempts share
 * the call's deadline. gRPC retries a call only until its first response message.
 */
export interface RetryPolicy {
  /** Attempts in all, 1..5 (gRPC's cap; 1 = no retries). */
  maxAttempts: number;
  /** Cap of the first wait, > 0. */
  initialBackoffSeconds: number;
  /** Cap of every wait, >= initialBackoffSeconds. */
  maxBackoffSeconds: number;
  /** Growth of the cap per retry, >= 1. */
  multiplier: number;
}

export const DEFAULT_RETRY: Readonly<RetryPolicy> = Object.freeze({
  maxAttempts: 5,
  initialBackoffSeconds: 0.2,
  maxBackoffSeconds: 5,
  multiplier: 2,
});

/** The policy with defaults filled in; INVALID_ARGUMENT naming the bad field. */
export function retryPolicy(partial: Partial<RetryPolicy> | undefined, base: RetryPolicy = DEFAULT_RETRY): RetryPolicy {
  const p = { ...base, ...partial };
  const bad = (field: string, why: string): never => {
    throw new StreambpError(grpc.status.INVALID_ARGUMENT, `retry.${field} = ${String(p[field as keyof RetryPolicy])} ${why}`);
  };
  if (!Number.isInteger(p.maxAttempts) || p.maxAttempts < 1 || p.maxAttempts > 5) {
    bad('maxAttempts', 'must be an integer in [1, 5] (1 = no retries; gRPC allows at most 5)');
  }
  // gRPC refuses a service config whose backoff is not a positive duration of whole nanoseconds.
  if (!(p.initialBackoffSeconds >= 1e-9) || !Number.isFinite(p.initialBackoffSeconds)) {
    bad('initialBackoffSeconds', 'must be a finite number of seconds > 0');
  }
  if (!(p.maxBackoffSeconds >= p.initialBackoffSeconds) || !Number.isFinite(p.maxBackoffSeconds)) {
    bad('maxBackoffSeconds', 'must be finite and >= initialBackoffSeconds');
  }
  if (!(p.multiplier >= 1) || !Number.isFinite(p.multiplier)) bad('multiplier', 'must be a finite number >= 1');
  return p;
}

/** A google.protobuf.Duration in JSON: decimal seconds, nanosecond grain, "s" suffix. */
function duration(seconds: number): string {
  return `${seconds.toFixed(9)}s`;
}

/**
 * The channel's service config (the JSON of the 'grpc.service_config' channel option): the
 * policy as the retryPolicy of every method of streambp.v1.Trainer. null when maxAttempts is 1.
 */
export function serviceConfig(policy: RetryPolicy): string | null {
  const p = retryPolicy(policy);
  if (p.maxAttempts === 1) return null;
  return JSON.stringify({
    methodConfig: [{
      name: [{ service: 'streambp.v1.Trainer' }],
      retryPolicy: {
        maxAttempts: p.maxAttempts, initialBackoff: duration(p.initialBackoffSeconds),
        maxBackoff: duration(p.maxBackoffSeconds), backoffMultiplier: p.multiplier,
        retryableStatusCodes: ['UNAVAILABLE'],
      },
    }],
  });
}

/** Whether a call that failed with this code is retried. */
export function isRetryable(code: grpc.status): boolean {
  return code === grpc.status.UNAVAILABLE;
}
