// The options and result types of Client (re-exported from ./client and the package).
import type * as grpc from '@grpc/grpc-js';
import type { RetryPolicy } from './retry';
import type * as T from './generated';

/** TLS of the channel. PEM values are the PEM text, a Buffer, or a path to a PEM file. */
export interface TlsOptions {
  /** Roots that sign the server's certificate; unset = the system's roots. */
  rootCerts?: string | Buffer | undefined;
  /** Client certificate chain and its private key, for mutual TLS (both or neither). */
  certChain?: string | Buffer | undefined;
  privateKey?: string | Buffer | undefined;
  /** Name checked against the server's certificate (grpc.ssl_target_name_override). */
  serverNameOverride?: string | undefined;
}

/** How to reach the server and how calls behave. */
export interface ClientOptions {
  /** Bearer token, sent as "authorization: Bearer <token>" on every call. */
  token?: string | undefined;
  /** true = TLS with the system's roots; an object for custom roots or mTLS; unset = plaintext. */
  tls?: boolean | TlsOptions | undefined;
  /** The session every call names when its request leaves `session` unset ("" = the default session). */
  session?: string | undefined;
  /** Default deadline of steps, log-probs, sampling, checkpoints, weights and session changes (600). */
  stepDeadlineSeconds?: number | undefined;
  /** Default deadline of GetInfo, EstimateMemory, Tokenize, Detokenize, stats and session queries (30). */
  infoDeadlineSeconds?: number | undefined;
  /** gRPC's retries of UNAVAILABLE (see RetryPolicy); defaults: 5 attempts, waits capped at 0.2 s doubling to 5 s. */
  retry?: Partial<RetryPolicy> | undefined;
  /** Largest message sent or received (64 MiB). */
  maxMessageBytes?: number | undefined;
  /** Wait for the channel to connect (up to the deadline) instead of failing fast. */
  waitForReady?: boolean | undefined;
  /** More @grpc/grpc-js client options: channel options (keepalive, proxies, ...), interceptors. */
  channelOptions?: grpc.ClientOptions | undefined;
}

/** Per-call options. */
export interface CallOptions {
  /** Deadline of the whole call, retries included; null = none; unset = the default of its kind. */
  deadlineSeconds?: number | null | undefined;
  /** Cancels the call (it then fails with CANCELLED). */
  signal?: AbortSignal | undefined;
  /** Extra metadata (request headers). */
  metadata?: Record<string, string> | undefined;
}

/** Options of calls that run a step: with onProgress the step runs through its *Progress RPC. */
export interface StepCallOptions extends CallOptions {
  /** Each progress message before "done": queued (position), started, forward/backward layer by layer, head, optimizer. */
  onProgress?: ((progress: T.StepProgress__Output) => void) | undefined;
}

/** A text input: a plain string, a conversation, or a Text message. */
export type TextInput = string | T.ChatMessage[] | T.Text;

/** What a custom loss returns: its value and dL/dlogp, one array per sequence (one entry per log-prob). */
export interface CustomLossOutput {
  loss: number;
  grads: ReadonlyArray<ArrayLike<number>>;
}

/**
 * A loss computed on the client: it gets the log-probs of each sequence in double precision
 * (logprobs[i][t] = log p(tokens[t+1] | tokens[..t])) and returns the loss and its gradient
 * with respect to each of them.
 */
export type CustomLossFn = (logprobs: number[][], sequences: number[][]) => CustomLossOutput | Promise<CustomLossOutput>;

/** Options of forwardBackwardCustom. */
export interface CustomLossOptions extends StepCallOptions {
  /** Log-probs of logits / temperature (default 1), the same in both passes. */
  temperature?: number;
  engine?: T.EngineOptions;
  request_id?: string;
  session?: string;
}

/** What forwardBackwardCustom returns. */
export interface CustomLossResult {
  /** The loss as the loss function computed it. */
  loss: number;
  /** The log-probs it was computed on (double precision). */
  logprobs: number[][];
  /** The policy version of those log-probs (and of the gradients). */
  policy_version: number;
  /** The server's answer to the weighted_logprobs step (its stats.loss is Σ w·logp). */
  forward_backward: T.ForwardBackwardResponse__Output;
}
