import * as grpc from '@grpc/grpc-js';

/**
 * Every failure of a call: a gRPC status from the server (INVALID_ARGUMENT with the field
 * named, FAILED_PRECONDITION, RESOURCE_EXHAUSTED, ...), a transport failure (UNAVAILABLE,
 * DEADLINE_EXCEEDED, CANCELLED) or a client-side check (INVALID_ARGUMENT for bad options
 * or inputs, DATA_LOSS for an inconsistent weights stream).
 *
 * `message` is the server's message as it sent it; `code` is the numeric gRPC status
 * (compare with `grpc.status.X` or `StreambpError.codes.X`), `codeName` its name.
 */
export class StreambpError extends Error {
  /** The gRPC status codes, so that callers need not import @grpc/grpc-js. */
  static readonly codes = grpc.status;

  /** Numeric gRPC status code. */
  readonly code: grpc.status;
  /** Name of the code, e.g. "INVALID_ARGUMENT". */
  readonly codeName: string;
  /** The RPC (e.g. "TrainStep") or client operation that failed. */
  readonly method: string;
  /** Trailing metadata of the call, when the server sent any. */
  readonly metadata?: grpc.Metadata;

  constructor(code: grpc.status, message: string,
              context: { method?: string; metadata?: grpc.Metadata } = {}) {
    super(message);
    this.name = 'StreambpError';
    this.code = code;
    this.codeName = grpc.status[code] ?? `CODE_${code}`;
    this.method = context.method ?? '';
    this.metadata = context.metadata;
  }

  override toString(): string {
    return `StreambpError: ${this.codeName}${this.method ? ` (${this.method})` : ''}: ${this.message}`;
  }
}

/** A status error of @grpc/grpc-js (or anything thrown) as a StreambpError. */
export function toStreambpError(error: unknown, method: string): StreambpError {
  if (error instanceof StreambpError) return error;
  const e = error as Partial<grpc.ServiceError> | undefined;
  if (e && typeof e.code === 'number' && e.code in grpc.status) {
    return new StreambpError(e.code, e.details ?? e.message ?? '', { method, metadata: e.metadata });
  }
  const message = error instanceof Error ? error.message : String(error);
  return new StreambpError(grpc.status.UNKNOWN, message, { method });
}
