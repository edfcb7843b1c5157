import { randomBytes } from 'crypto';
import * as fs from 'fs';
import * as grpc from '@grpc/grpc-js';
import type { MethodDefinition } from '@grpc/proto-loader';
import { StreambpError, toStreambpError } from './errors';
import { trainerService } from './proto';
import { isRetryable, retryPolicy, serviceConfig, type RetryPolicy } from './retry';
import { RolloutStream } from './rollouts';
import { writeWeightsFolder, type ExportedFolder } from './weights';
import type * as T from './generated';
import type { TrainerDefinition } from './generated/streambp/v1/Trainer';

import type { CallOptions, ClientOptions, CustomLossFn, CustomLossOptions, CustomLossResult, StepCallOptions,
              TextInput, TlsOptions } from './options';
export type { CallOptions, ClientOptions, CustomLossFn, CustomLossOptions, CustomLossOutput, CustomLossResult,
              StepCallOptions, TextInput, TlsOptions } from './options';

type DeadlineKind = 'info' | 'step' | 'none';
interface Traits {
  readonly deadline: DeadlineKind;
  /** The request has a `session` field, filled from ClientOptions.session when unset. */
  readonly session?: boolean;
  /** Mutating: a random request_id when unset, the same on every attempt. */
  readonly requestId?: boolean;
}

/** Every RPC of streambp.v1.Trainer and how the client treats it (test/unit checks that none is missing). */
export const METHODS = {
  GetInfo: { deadline: 'info', session: true },
  ForwardBackward: { deadline: 'step', session: true, requestId: true },
  ForwardBackwardProgress: { deadline: 'step', session: true, requestId: true },
  OptimStep: { deadline: 'step', session: true, requestId: true },
  TrainStep: { deadline: 'step', session: true, requestId: true },
  TrainStepProgress: { deadline: 'step', session: true, requestId: true },
  ComputeLogprobs: { deadline: 'step', session: true },
  SaveCheckpoint: { deadline: 'step', session: true, requestId: true },
  LoadCheckpoint: { deadline: 'step', session: true, requestId: true },
  ExportWeights: { deadline: 'step', session: true },
  EstimateMemory: { deadline: 'info', session: true },
  Tokenize: { deadline: 'info' },
  Detokenize: { deadline: 'info' },
  Sample: { deadline: 'step', session: true },
  PushRollouts: { deadline: 'step', session: true },
  PushRolloutsStream: { deadline: 'none' },
  WatchPolicy: { deadline: 'none', session: true },
  GetRolloutStats: { deadline: 'info', session: true },
  GetHistory: { deadline: 'info', session: true },
  CreateSession: { deadline: 'step', requestId: true },
  GetSession: { deadline: 'info' },
  ListSessions: { deadline: 'info' },
  DeleteSession: { deadline: 'step', requestId: true },
  SaveWeightsForSampler: { deadline: 'step', session: true, requestId: true },
  ListSnapshots: { deadline: 'info', session: true },
  DeleteSnapshot: { deadline: 'step', session: true, requestId: true },
} as const satisfies Record<string, Traits>;

type Method = keyof typeof METHODS;
/* eslint-disable @typescript-eslint/no-explicit-any */
type Req<M extends Method> = TrainerDefinition[M] extends MethodDefinition<infer I, any, any, any> ? I : never;
type Res<M extends Method> = TrainerDefinition[M] extends MethodDefinition<any, any, any, infer O> ? O : never;
/* eslint-enable @typescript-eslint/no-explicit-any */

/** A new random request id: 128 bits as 32 lowercase hex digits. */
export function newRequestId(): string {
  return randomBytes(16).toString('hex');
}

function pem(value: string | Buffer | undefined): Buffer | null {
  if (value === undefined) return null;
  if (Buffer.isBuffer(value)) return value;
  if (value.includes('-----BEGIN')) return Buffer.from(value);
  try {
    return fs.readFileSync(value);
  } catch (e) {
    throw new StreambpError(grpc.status.NOT_FOUND, `cannot read PEM file ${value}: ${(e as Error).message}`);
  }
}

function invalid(message: string): StreambpError {
  return new StreambpError(grpc.status.INVALID_ARGUMENT, message);
}

function cancelled(method: string): StreambpError {
  return new StreambpError(grpc.status.CANCELLED, 'cancelled by the caller', { method });
}

/** Runs `fn` when the signal aborts; returns the function that stops listening. */
function onAbort(signal: AbortSignal | undefined, fn: () => void): () => void {
  if (!signal) return () => undefined;
  signal.addEventListener('abort', fn, { once: true });
  return () => signal.removeEventListener('abort', fn);
}

function sleep(ms: number, signal: AbortSignal | undefined, method: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const stop = onAbort(signal, () => {
      clearTimeout(timer);
      reject(cancelled(method));
    });
    const timer = setTimeout(() => {
      stop();
      resolve();
    }, ms);
  });
}

function toText(input: TextInput): T.Text {
  if (typeof input === 'string') return { text: input };
  if (Array.isArray(input)) return { messages: input };
  return input;
}

function isTokenSequence(s: ArrayLike<number> | T.TokenSequence): s is T.TokenSequence {
  return typeof (s as ArrayLike<number>).length !== 'number';
}

function checkFinite(value: number, what: string): void {
  if (typeof value !== 'number' || !Number.isFinite(value)) throw invalid(`${what} = ${String(value)} is not a finite number`);
}

/**
 * A client of one streambp-server: every RPC of streambp.v1.Trainer as a method (unary
 * RPCs return promises, server streams are async iterators, PushRolloutsStream is a
 * RolloutStream), plus conveniences (progress callbacks, text prompts, export to a folder,
 * custom losses).
 *
 * Requests and responses are the generated types (field names as in the proto), exported
 * by the package: a request is `XRequest`, an answer `XResponse__Output` (every field
 * present, 64-bit integers as numbers).
 *
 * Deadlines: every call has one (CallOptions.deadlineSeconds, else the default of its kind)
 * that covers all its attempts, except WatchPolicy and PushRolloutsStream, which run until
 * cancelled unless given one. Retries: UNAVAILABLE only, by gRPC itself (RetryPolicy as
 * the channel's service-config retryPolicy, so a retry re-sends the same bytes); mutating calls
 * (ForwardBackward, OptimStep, TrainStep, SaveCheckpoint, LoadCheckpoint, CreateSession,
 * DeleteSession and their *Progress forms) get a random request_id when the request has none
 * and send the same one on every attempt, so the server applies them at most once; groups
 * of PushRollouts get a random group_id for the same reason. gRPC retries a call only until
 * its first response message; after one, WatchPolicy and the progress streams resume where
 * they left off (a new call), and ExportWeights fails UNAVAILABLE (calling again starts over).
 * Errors: every failure is a StreambpError.
 *
 * One Client owns one channel (connected lazily, reconnected after failures); calls may run
 * concurrently (the server still runs steps one at a time, in arrival order). withSession()
 * gives a view on the same channel. close() when done.
 */
export class Client {
  /** The session of calls whose request leaves `session` unset. */
  readonly session: string;
  private readonly channel: grpc.Client;
  private readonly service: TrainerDefinition;
  private readonly retry: RetryPolicy;
  private readonly options: ClientOptions;

  /** Connects lazily to `target` ("host:port" or any gRPC target). INVALID_ARGUMENT for bad options. */
  constructor(readonly target: string, options: ClientOptions = {}) {
    if (!target) throw invalid('target is empty');
    for (const key of ['stepDeadlineSeconds', 'infoDeadlineSeconds', 'maxMessageBytes'] as const) {
      const v = options[key];
      if (v !== undefined && !(v > 0)) throw invalid(`${key} = ${v} must be > 0`);
    }
    this.options = options;
    this.session = options.session ?? '';
    this.retry = retryPolicy(options.retry);
    this.service = trainerService();
    const maxBytes = options.maxMessageBytes ?? 64 << 20;
    const config = serviceConfig(this.retry);
    // gRPC keeps a request for a retry only up to its per-call retry buffer (256 KiB by
    // default), so a larger batch would not be retried at all: the buffer is the message limit.
    const channelOptions: grpc.ClientOptions = {
      'grpc.max_receive_message_length': maxBytes,
      'grpc.max_send_message_length': maxBytes,
      ...(config === null ? { 'grpc.enable_retries': 0 } : {
        'grpc.enable_retries': 1, 'grpc.service_config': config,
        'grpc.per_rpc_retry_buffer_size': maxBytes, 'grpc.retry_buffer_size': Math.max(maxBytes, 256 << 20),
      }),
      ...options.channelOptions,
    };
    let credentials = grpc.credentials.createInsecure();
    if (options.tls) {
      const tls: TlsOptions = options.tls === true ? {} : options.tls;
      if ((tls.certChain === undefined) !== (tls.privateKey === undefined)) {
        throw invalid('tls.certChain and tls.privateKey go together (mutual TLS)');
      }
      credentials = grpc.credentials.createSsl(pem(tls.rootCerts), pem(tls.privateKey), pem(tls.certChain));
      if (tls.serverNameOverride) channelOptions['grpc.ssl_target_name_override'] = tls.serverNameOverride;
    }
    this.channel = new grpc.Client(target, credentials, channelOptions);
  }

  /** The same client (same channel) naming another session by default. */
  withSession(session: string): Client {
    const view = Object.create(Client.prototype) as Client;
    Object.assign(view, this, { session });
    return view;
  }

  /** Closes the channel (shared by every withSession() view); calls in flight are cancelled. */
  close(): void {
    this.channel.close();
  }

  // --- Model and steps ------------------------------------------------------------------

  /** Model, dtype, device, engine, chunk sizes, policy version, tokenizer, limits (and the session's state). */
  getInfo(request: T.GetInfoRequest = {}, options?: CallOptions): Promise<T.GetInfoResponse__Output> {
    return this.unary('GetInfo', request, options);
  }

  /** Forward and backward of a batch; gradients accumulate until optimStep. Mutating. */
  forwardBackward(request: T.ForwardBackwardRequest, options: StepCallOptions = {}): Promise<T.ForwardBackwardResponse__Output> {
    if (!options.onProgress) return this.unary('ForwardBackward', request, options);
    const prepared = this.prepare('ForwardBackward', request);
    return this.withProgress('ForwardBackwardProgress', this.forwardBackwardProgress(prepared, options),
                             (p) => p.forward_backward, () => this.unary('ForwardBackward', prepared, options),
                             options.onProgress);
  }

  /** ForwardBackward as its progress stream; the last message ("done") carries the answer. Mutating. */
  forwardBackwardProgress(request: T.ForwardBackwardRequest, options?: CallOptions): AsyncGenerator<T.StepProgress__Output> {
    return this.serverStream('ForwardBackwardProgress', request, options, (r) => r);
  }

  /** Applies the accumulated gradients (adam_params: this step's own, Tinker's AdamParams); the policy version then increases by one. Mutating. */
  optimStep(request: T.OptimStepRequest = {}, options?: CallOptions): Promise<T.OptimStepResponse__Output> {
    return this.unary('OptimStep', request, options);
  }

  /** ForwardBackward + OptimStep: the usual path. With options.onProgress, through TrainStepProgress. Mutating. */
  trainStep(request: T.TrainStepRequest, options: StepCallOptions = {}): Promise<T.TrainStepResponse__Output> {
    if (!options.onProgress) return this.unary('TrainStep', request, options);
    const prepared = this.prepare('TrainStep', request);
    return this.withProgress('TrainStepProgress', this.trainStepProgress(prepared, options),
                             (p) => p.train_step, () => this.unary('TrainStep', prepared, options), options.onProgress);
  }

  /** TrainStep as its progress stream; the last message ("done") carries the answer. Mutating. */
  trainStepProgress(request: T.TrainStepRequest, options?: CallOptions): AsyncGenerator<T.StepProgress__Output> {
    return this.serverStream('TrainStepProgress', request, options, (r) => r);
  }

  /** Per-token log-probs under the policy (or the reference model); fp64 adds them in double precision. */
  computeLogprobs(request: T.ComputeLogprobsRequest, options?: CallOptions): Promise<T.ComputeLogprobsResponse__Output> {
    return this.unary('ComputeLogprobs', request, options);
  }

  /** Predicted peak memory of a step and whether it fits the server's budget. */
  estimateMemory(request: T.EstimateMemoryRequest, options?: CallOptions): Promise<T.EstimateMemoryResponse__Output> {
    return this.unary('EstimateMemory', request, options);
  }

  /**
   * A custom loss, exact: computes the log-probs of `sequences` in double precision
   * (ComputeLogprobs fp64), runs `lossFn` on them here, and sends w = dL/dlogp as a
   * weighted_logprobs batch (L' = Σ w·logp has the gradient of the client's loss) at the
   * policy version of those log-probs; the server refuses it with FAILED_PRECONDITION
   * if the policy has moved in between. Gradients accumulate until optimStep. Mutating.
   */
  async forwardBackwardCustom(sequences: ReadonlyArray<ArrayLike<number> | T.TokenSequence>, lossFn: CustomLossFn,
                              options: CustomLossOptions = {}): Promise<CustomLossResult> {
    const { temperature, engine, request_id, session, ...call } = options;
    const tokens = sequences.map((s) => Array.from(isTokenSequence(s) ? s.tokens ?? [] : s));
    const computed = await this.computeLogprobs(
      { sequences: tokens.map((t) => ({ tokens: t })), fp64: true, temperature, session }, call);
    const logprobs = computed.sequences.map((s, i) => {
      if (s.logprobs_fp64.length !== tokens[i].length - 1) {
        throw new StreambpError(grpc.status.FAILED_PRECONDITION,
                                `the server returned ${s.logprobs_fp64.length} fp64 log-probs for sequence ${i} of ` +
                                `${tokens[i].length} tokens (a server without ComputeLogprobsRequest.fp64?)`,
                                { method: 'ForwardBackwardCustom' });
      }
      return s.logprobs_fp64;
    });
    const out = await lossFn(logprobs, tokens);
    checkFinite(out?.loss, 'loss');
    if (!out.grads || out.grads.length !== tokens.length) {
      throw invalid(`grads has ${out.grads?.length} sequences, expected ${tokens.length}`);
    }
    const weighted = out.grads.map((g, i) => {
      if (g.length !== logprobs[i].length) throw invalid(`grads[${i}] has ${g.length} entries, expected ${logprobs[i].length}`);
      const weights = Array.from(g);
      weights.forEach((w, t) => checkFinite(w, `grads[${i}][${t}]`));
      return { tokens: tokens[i], weights };
    });
    const forward_backward = await this.forwardBackward({
      request_id, session, engine, objective: 'weighted_logprobs',
      batch: { weighted: { sequences: weighted, policy_version: computed.policy_version } },
      weighted: temperature === undefined ? {} : { temperature },
    }, call);
    return { loss: out.loss, logprobs, policy_version: computed.policy_version, forward_backward };
  }

  // --- State ------------------------------------------------------------------------------

  /** Full resumable state under a name in the server's checkpoint directory. Mutating. */
  saveCheckpoint(request: T.SaveCheckpointRequest = {}, options?: CallOptions): Promise<T.SaveCheckpointResponse__Output> {
    return this.unary('SaveCheckpoint', request, options);
  }

  /** Restores a checkpoint (empty name = the newest). Mutating. */
  loadCheckpoint(request: T.LoadCheckpointRequest = {}, options?: CallOptions): Promise<T.LoadCheckpointResponse__Output> {
    return this.unary('LoadCheckpoint', request, options);
  }

  /** The weights as a stream of safetensors pieces (then the side files with with_files). */
  exportWeights(request: T.ExportWeightsRequest = {}, options?: CallOptions): AsyncGenerator<T.WeightsChunk__Output> {
    return this.serverStream('ExportWeights', request, options);
  }

  /**
   * The weights written into `dir`, verified: model.safetensors + config.json (an adapter
   * session: adapter_model.safetensors + adapter_config.json; merged: true for the whole
   * model), and with with_files (the default here) the model folder's other files, so the
   * folder loads in transformers / vLLM as is. gRPC retries UNAVAILABLE until the first
   * message; a stream broken later fails UNAVAILABLE, and calling again starts over.
   */
  exportWeightsToFolder(dir: string, request: T.ExportWeightsRequest = {}, options: CallOptions = {}): Promise<ExportedFolder> {
    const prepared = this.prepare('ExportWeights', { with_files: true, ...request });
    const deadline = this.deadlineOf('ExportWeights', options);
    return writeWeightsFolder(this.serverStream('ExportWeights', prepared, options, undefined, deadline), dir);
  }

  // --- Text -------------------------------------------------------------------------------

  /** Texts or conversations to ids (and loss masks), and a batch's text forms resolved as a step would. */
  tokenize(request: T.TokenizeRequest, options?: CallOptions): Promise<T.TokenizeResponse__Output> {
    return this.unary('Tokenize', request, options);
  }

  /** Ids back to text. */
  detokenize(request: T.DetokenizeRequest, options?: CallOptions): Promise<T.DetokenizeResponse__Output> {
    return this.unary('Detokenize', request, options);
  }

  /** One text or conversation with the model's tokenizer and chat format: ids, loss mask, rendered text. */
  async tokenizeText(input: TextInput, flags: { add_special_tokens?: boolean; add_generation_prompt?: boolean } = {},
                     options?: CallOptions): Promise<T.TokenizedText__Output> {
    const response = await this.tokenize({ inputs: [toText(input)], ...flags }, options);
    return response.outputs[0];
  }

  /** One sequence of ids as text. */
  async detokenizeIds(ids: number[], flags: { skip_special_tokens?: boolean } = {}, options?: CallOptions): Promise<string> {
    const response = await this.detokenize({ sequences: [{ tokens: ids }], ...flags }, options);
    return response.texts[0];
  }

  // --- The RL loop ------------------------------------------------------------------------

  /** Completions from the current policy with per-token log-probs and the policy version. */
  sample(request: T.SampleRequest, options?: CallOptions): Promise<T.SampleResponse__Output> {
    return this.unary('Sample', request, options);
  }

  /** Completions of text prompts (strings, or conversations ending with the generation prompt); each has .text. */
  sampleText(prompts: TextInput[], request: Omit<T.SampleRequest, 'prompts' | 'text_prompts'> & { max_tokens: number },
             options?: CallOptions): Promise<T.SampleResponse__Output> {
    return this.sample({ ...request, text_prompts: prompts.map(toText) }, options);
  }

  /** Rollout groups for server-side GRPO steps, one ack each (groups without group_id get a random one). */
  pushRollouts(request: T.PushRolloutsRequest, options?: CallOptions): Promise<T.PushRolloutsResponse__Output> {
    const groups = (request.groups ?? []).map((g) => (g.group_id ? g : { ...g, group_id: newRequestId() }));
    return this.unary('PushRollouts', { ...request, groups }, options);
  }

  /** A PushRolloutsStream: push groups one at a time, one ack each, in order (see RolloutStream). */
  pushRolloutsStream(options: CallOptions = {}): RolloutStream {
    const def = this.definition('PushRolloutsStream');
    const deadline = this.deadlineOf('PushRolloutsStream', options);
    const call = this.channel.makeBidiStreamRequest(def.path, def.requestSerialize, def.responseDeserialize,
                                                    this.metadata(options), this.callOptions(deadline));
    const stop = onAbort(options.signal, () => call.cancel());
    call.on('status', stop);
    const session = this.session;
    return new RolloutStream(call, (g) => (g.session == null && session ? { ...g, session } : g));
  }

  /** One message per new policy version from since_version on; reconnects after UNAVAILABLE where it left off. */
  watchPolicy(request: T.WatchPolicyRequest = {}, options?: CallOptions): AsyncGenerator<T.PolicyUpdate__Output> {
    return this.serverStream('WatchPolicy', request, options,
                             (r, last) => (last ? { ...r, since_version: last.policy_version } : r));
  }

  /** Counters of the rollout queue. */
  getRolloutStats(request: T.GetRolloutStatsRequest = {}, options?: CallOptions): Promise<T.RolloutStats__Output> {
    return this.unary('GetRolloutStats', request, options);
  }

  /**
   * The session's training history, oldest first: one record per optimizer step (loss,
   * objective metrics, grad norm, lr, tokens/s, memory, version, time). Page with
   * `after_index` (the last index seen) to follow training; `last_index` is the newest.
   */
  getHistory(request: T.GetHistoryRequest = {}, options?: CallOptions): Promise<T.GetHistoryResponse__Output> {
    return this.unary('GetHistory', request, options);
  }

  // --- Sessions ---------------------------------------------------------------------------

  /** A new session (a LoRA adapter, an uploaded PEFT adapter, or full fine-tuning). Mutating. */
  createSession(request: T.CreateSessionRequest, options?: CallOptions): Promise<T.SessionInfo__Output> {
    return this.unary('CreateSession', request, options);
  }

  getSession(request: T.GetSessionRequest, options?: CallOptions): Promise<T.SessionInfo__Output> {
    return this.unary('GetSession', request, options);
  }

  /** The sessions this token may see. */
  listSessions(request: T.ListSessionsRequest = {}, options?: CallOptions): Promise<T.ListSessionsResponse__Output> {
    return this.unary('ListSessions', request, options);
  }

  /** Removes a session, its state and its queued rollouts (not its checkpoints). Mutating. */
  deleteSession(request: T.DeleteSessionRequest, options?: CallOptions): Promise<T.DeleteSessionResponse__Output> {
    return this.unary('DeleteSession', request, options);
  }

  // --- Sampler snapshots ------------------------------------------------------------------

  /**
   * Freezes the session's weights now (a LoRA session's adapter) as a named snapshot that
   * sample / computeLogprobs / exportWeights target with `snapshot: name` while the session
   * trains on. Bounded per session (RESOURCE_EXHAUSTED; `replace_oldest` makes room by
   * removing the oldest); `ttl_seconds` removes it later. Mutating.
   */
  saveWeightsForSampler(request: T.SaveWeightsForSamplerRequest, options?: CallOptions): Promise<T.SnapshotInfo__Output> {
    return this.unary('SaveWeightsForSampler', request, options);
  }

  /** The session's live sampler snapshots, oldest first, and the per-session bounds. */
  listSnapshots(request: T.ListSnapshotsRequest = {}, options?: CallOptions): Promise<T.ListSnapshotsResponse__Output> {
    return this.unary('ListSnapshots', request, options);
  }

  /** Removes a sampler snapshot from memory and disk. Mutating. */
  deleteSnapshot(request: T.DeleteSnapshotRequest, options?: CallOptions): Promise<T.DeleteSnapshotResponse__Output> {
    return this.unary('DeleteSnapshot', request, options);
  }

  // --- Mechanics --------------------------------------------------------------------------

  private definition<M extends Method>(method: M): MethodDefinition<Req<M>, unknown, unknown, Res<M>> {
    return this.service[method] as unknown as MethodDefinition<Req<M>, unknown, unknown, Res<M>>;
  }

  /** The request with the client's session and, for mutating calls, a request id filled in. */
  private prepare<M extends Method>(method: M, request: Req<M>): Req<M> {
    const traits: Traits = METHODS[method];
    const r: Record<string, unknown> = { ...(request as object) };
    if (traits.session && r.session == null && this.session) r.session = this.session;
    if (traits.requestId && !r.request_id) r.request_id = newRequestId();
    return r as Req<M>;
  }

  private deadlineOf(method: Method, options: CallOptions): number {
    let seconds = options.deadlineSeconds;
    if (seconds === undefined) {
      const kind: DeadlineKind = METHODS[method].deadline;
      seconds = kind === 'info' ? this.options.infoDeadlineSeconds ?? 30
              : kind === 'step' ? this.options.stepDeadlineSeconds ?? 600 : null;
    }
    if (seconds !== null && !(seconds > 0)) throw invalid(`deadlineSeconds = ${seconds} must be > 0 (or null for none)`);
    return seconds === null ? Infinity : Date.now() + seconds * 1000;
  }

  private metadata(options: CallOptions): grpc.Metadata {
    const metadata = new grpc.Metadata();
    if (this.options.token) metadata.set('authorization', `Bearer ${this.options.token}`);
    for (const [key, value] of Object.entries(options.metadata ?? {})) metadata.set(key, value);
    return metadata;
  }

  private callOptions(deadline: number): grpc.CallOptions {
    return { deadline, ...(this.options.waitForReady ? { waitForReady: true } : {}) } as grpc.CallOptions;
  }

  private unary<M extends Method>(method: M, request: Req<M>, options: CallOptions = {}): Promise<Res<M>> {
    const def = this.definition(method);
    const prepared = this.prepare(method, request);
    const deadline = this.deadlineOf(method, options);
    if (options.signal?.aborted) return Promise.reject(cancelled(method));
    return new Promise<Res<M>>((resolve, reject) => {
      let stop = (): void => undefined;
      const call = this.channel.makeUnaryRequest(def.path, def.requestSerialize, def.responseDeserialize, prepared,
                                                 this.metadata(options), this.callOptions(deadline), (error, response) => {
        stop();
        if (error) reject(toStreambpError(error, method));
        else resolve(response as Res<M>);
      });
      stop = onAbort(options.signal, () => call.cancel());
    });
  }

  /**
   * A server stream as an async iterator. gRPC retries UNAVAILABLE until the first message;
   * with `resume`, a stream that breaks with UNAVAILABLE after a message is resumed by a new
   * call with resume(request, last message), after the policy's first backoff, as long as
   * every call brings a message. Leaving the loop early cancels the call.
   */
  private async *serverStream<M extends Method>(method: M, request: Req<M>, options: CallOptions = {},
                                                resume?: (request: Req<M>, last: Res<M> | undefined) => Req<M>,
                                                deadlineAt?: number): AsyncGenerator<Res<M>> {
    const def = this.definition(method);
    let current = this.prepare(method, request);
    const deadline = deadlineAt ?? this.deadlineOf(method, options);
    let last: Res<M> | undefined;
    for (;;) {
      if (options.signal?.aborted) throw cancelled(method);
      const call = this.channel.makeServerStreamRequest(def.path, def.requestSerialize, def.responseDeserialize, current,
                                                        this.metadata(options), this.callOptions(deadline));
      call.on('error', () => undefined);  // reported through the iteration below
      const stop = onAbort(options.signal, () => call.cancel());
      let received = false;
      try {
        for await (const message of call) {
          received = true;
          last = message as Res<M>;
          yield last;
        }
        return;
      } catch (e) {
        const error = toStreambpError(e, method);
        const wait = this.retry.initialBackoffSeconds * 1000;
        const resumable = resume && received && isRetryable(error.code) && !options.signal?.aborted &&
                          Date.now() + wait < deadline;
        if (!resumable) throw error;
        current = resume(current, last);
        await sleep(wait, options.signal, method);
      } finally {
        stop();
        call.cancel();
      }
    }
  }

  /** Runs a step through its progress stream: onProgress before "done", the answer from "done". */
  private async withProgress<R>(method: string, steps: AsyncIterable<T.StepProgress__Output>,
                                pick: (done: T.StepProgress__Output) => R | null | undefined,
                                unaryFallback: () => Promise<R>,
                                onProgress: (progress: T.StepProgress__Output) => void): Promise<R> {
    let seen = false;
    let answer: R | null | undefined;
    try {
      for await (const progress of steps) {  // to the stream's end: "done" is its last message
        seen = true;
        if (progress.state !== 'done') {
          onProgress(progress);
          continue;
        }
        answer = pick(progress);
        if (!answer) throw new StreambpError(grpc.status.DATA_LOSS, 'the "done" message carries no answer', { method });
      }
    } catch (e) {
      // A server from before the progress RPCs: the plain call, with the same request id.
      if (!seen && e instanceof StreambpError && e.code === grpc.status.UNIMPLEMENTED) return unaryFallback();
      throw e;
    }
    if (!answer) throw new StreambpError(grpc.status.DATA_LOSS, 'the stream ended before its "done" message', { method });
    return answer;
  }
}
