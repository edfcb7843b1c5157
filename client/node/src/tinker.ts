/**
 * Tinker's client surface over streambp-server, as the Python SDK's `streambp.tinker`: a
 * ServiceClient makes LoRA training clients (sessions of a server with sessions.enabled), a
 * training client runs forward_backward on Datums for a loss by name and optim_step with
 * AdamParams, and save_weights_for_sampler freezes the adapter into a sampler snapshot (the
 * server's SaveWeightsForSampler) that samples the same while training goes on.
 *
 *   import { tinker } from '@streambp/client';
 *   const service = new tinker.ServiceClient({ baseUrl: '127.0.0.1:50051' });
 *   const training = await service.createLoraTrainingClient({ baseModel: 'tiny', rank: 8 });
 *   const fb = await training.forwardBackward([tinker.datum(tokens.slice(0, -1), { target_tokens: tokens.slice(1),
 *     weights })], 'cross_entropy');
 *   await training.optimStep({ learning_rate: 1e-4 });
 *   const sampler = await training.saveWeightsAndGetSamplingClient('step-1');
 *   const out = await sampler.sample([1, 2, 3], 4, { max_tokens: 16 });
 */
import { randomUUID } from 'crypto';
import { Client, type ClientOptions } from './client';
import { StreambpError } from './errors';
import type { TextInput } from './options';
import type * as T from './generated';

function invalid(message: string): StreambpError {
  return new StreambpError(StreambpError.codes.INVALID_ARGUMENT, message);
}

/**
 * A per-token input: numbers (one per input token), rows of K numbers (2-D: cross_entropy's
 * top-k target_tokens and their weights, for distillation) or a TensorData as the proto has it.
 */
export type TensorLike = ArrayLike<number> | ArrayLike<ArrayLike<number>> | T.TensorData;

/**
 * A Datum (Tinker's): the tokens the model reads and the loss's inputs by name (target_tokens
 * first). The model input may also be text (a string or chat messages), which the server
 * tokenizes: target_tokens may then be left out (the tokenization shifted by one), a
 * conversation trains on its assistant turns, and cross_entropy's weights may be left out (1 each).
 */
export function datum(modelInput: ArrayLike<number> | TextInput, lossFnInputs: Record<string, TensorLike> = {}): T.Datum {
  const inputs: Record<string, T.TensorData> = {};
  for (const [name, values] of Object.entries(lossFnInputs)) {
    if (!isArrayLike(values)) {
      inputs[name] = values;
      continue;
    }
    const { list, shape } = flatten(name, values);
    if (name === 'target_tokens') {
      if (!list.every(Number.isInteger)) throw invalid(`loss_fn_inputs[${name}]: token ids must be integers`);
      inputs[name] = { int_data: list, shape };
    } else {
      list.forEach((v, i) => {
        if (!Number.isFinite(v)) throw invalid(`loss_fn_inputs[${name}][${i}] is not finite`);
      });
      inputs[name] = { float_data: list, shape };
    }
  }
  if (typeof modelInput === 'string') return { model_input: { text: { text: modelInput } }, loss_fn_inputs: inputs };
  if (!isArrayLike(modelInput as TensorLike)) return { model_input: { text: modelInput as T.Text }, loss_fn_inputs: inputs };
  const items = Array.from(modelInput as ArrayLike<number | T.ChatMessage>);
  if (items.some((m) => typeof m !== 'number')) {
    return { model_input: { text: { messages: items as T.ChatMessage[] } }, loss_fn_inputs: inputs };
  }
  return { model_input: { tokens: items as number[] }, loss_fn_inputs: inputs };
}

function isArrayLike(v: TensorLike): v is ArrayLike<number> | ArrayLike<ArrayLike<number>> {
  return typeof (v as ArrayLike<number>).length === 'number';
}

/** A datum's loss_fn_outputs shape: [N, K] for 2-D target_tokens (the candidates' log-probs), else [N]. */
function outputShape(d: T.Datum | undefined, n: number): number[] {
  const shape = (d?.loss_fn_inputs?.target_tokens?.shape ?? []).map(Number);
  return shape.length === 2 ? shape : [n];
}

/** Numbers in row-major order with their shape: [N] for a list, [N, K] for rows of K. */
function flatten(name: string, values: ArrayLike<number> | ArrayLike<ArrayLike<number>>): { list: number[]; shape: number[] } {
  const rows = Array.from(values as ArrayLike<number | ArrayLike<number>>);
  if (!rows.some((r) => typeof r !== 'number')) return { list: rows as number[], shape: [rows.length] };
  const list: number[] = [];
  let k = -1;
  rows.forEach((row, i) => {
    if (typeof row === 'number' || typeof (row as ArrayLike<number>).length !== 'number') {
      throw invalid(`loss_fn_inputs[${name}][${i}]: expected a row of numbers (every row the same length)`);
    }
    const r = Array.from(row as ArrayLike<number>);
    if (k >= 0 && r.length !== k) {
      throw invalid(`loss_fn_inputs[${name}][${i}] has ${r.length} entries; the rows before it have ${k}`);
    }
    k = r.length;
    list.push(...r);
  });
  return { list, shape: [rows.length, k] };
}

/** loss_fn_config from plain values. */
export function lossFnConfig(config: Record<string, number | string | boolean>): Record<string, T.ConfigValue> {
  const out: Record<string, T.ConfigValue> = {};
  for (const [key, v] of Object.entries(config)) {
    out[key] = typeof v === 'number' ? { number: v } : typeof v === 'string' ? { text: v } : { flag: v };
  }
  return out;
}

export interface AdamParams {
  learning_rate?: number;
  beta1?: number;
  beta2?: number;
  eps?: number;
  weight_decay?: number;
  grad_clip_norm?: number;
}

export interface SamplingParams {
  max_tokens?: number;
  temperature?: number;
  top_p?: number;
  seed?: number;
  stop?: number[];
}

export interface SampledSequence {
  tokens: number[];
  logprobs: number[];
  stop_reason: string;
}

export interface ForwardBackwardOutput {
  /** loss:sum, targets:sum and the loss's own metrics (e.g. clip_fraction). */
  metrics: Record<string, number>;
  /**
   * Per datum, the log-probs of its target tokens at the weights of the gradients (when
   * returnLogprobs), row-major with their shape: [N], or [N, K] for 2-D target_tokens (the candidates').
   */
  loss_fn_outputs: Array<{ logprobs: number[]; shape: number[] }>;
}

/** Samples from a sampler snapshot of a session, or from a training session's current weights. */
export class SamplingClient {
  constructor(private readonly client: Client, readonly snapshot = '') {}

  get session(): string {
    return this.client.session;
  }

  async sample(prompt: ArrayLike<number>, numSamples = 1, params: SamplingParams = {}): Promise<{ sequences: SampledSequence[] }> {
    const request: T.SampleRequest = { prompts: [{ tokens: Array.from(prompt) }], n: numSamples,
                                       max_tokens: params.max_tokens ?? 16, stop_tokens: params.stop ?? [],
                                       snapshot: this.snapshot };
    if (params.temperature !== undefined) request.temperature = params.temperature;
    if (params.top_p !== undefined) request.top_p = params.top_p;
    if (params.seed !== undefined) request.seed = params.seed;
    const out = await this.client.sample(request);
    return { sequences: out.completions.map((c) => ({ tokens: c.tokens, logprobs: c.logprobs, stop_reason: c.finish_reason })) };
  }

  /** log p of each prompt token given the ones before it (null for the first). */
  async computeLogprobs(prompt: ArrayLike<number>): Promise<Array<number | null>> {
    const out = await this.client.computeLogprobs({ sequences: [{ tokens: Array.from(prompt) }], fp64: true,
                                                    snapshot: this.snapshot });
    return [null, ...(out.sequences[0]?.logprobs_fp64 ?? [])];
  }
}

/** A LoRA session: steps on Datums for a loss by name, Adam steps, sampler snapshots. */
export class TrainingClient {
  /** forwardBackward returns each datum's log-probs (loss_fn_outputs), as Tinker's: one more forward pass on the server. */
  returnLogprobs = true;

  constructor(private readonly service: ServiceClient, readonly client: Client, readonly baseModel: string) {}

  get session(): string {
    return this.client.session;
  }

  async forwardBackward(data: T.Datum[], lossFn: string,
                        config: Record<string, number | string | boolean> = {}): Promise<ForwardBackwardOutput> {
    const out = await this.client.forwardBackward({ objective: lossFn, batch: { data: { data } },
                                                    loss_fn_config: lossFnConfig(config),
                                                    return_logprobs: this.returnLogprobs });
    const stats = out.stats;
    return { metrics: { 'loss:sum': stats?.loss ?? NaN, 'targets:sum': Number(stats?.targets ?? 0), ...stats?.metrics },
             loss_fn_outputs: out.logprobs.map((s, i) => ({ logprobs: s.logprobs_fp64,
                                                            shape: outputShape(data[i], s.logprobs_fp64.length) })) };
  }

  async optimStep(adam: AdamParams = {}): Promise<{ metrics: Record<string, number> }> {
    const out = await this.client.optimStep({ adam_params: adam });
    return { metrics: { grad_norm: out.grad_norm, learning_rate: out.learning_rate, step: Number(out.step) } };
  }

  async saveState(name: string): Promise<{ path: string }> {
    const out = await this.client.saveCheckpoint({ name });
    return { path: `streambp://${this.session}/${out.name}` };
  }

  async loadState(pathOrName: string): Promise<void> {
    await this.client.loadCheckpoint({ name: pathOrName.split('/').pop() ?? pathOrName });
  }

  /**
   * Freezes the adapter as it is now into the server's sampler snapshot `name`
   * (streambp://<session>/sampler_weights/<name>). The server bounds a session's snapshots
   * (sessions.max_snapshots): RESOURCE_EXHAUSTED at the bound, or with `replaceOldest` the
   * oldest make room.
   */
  async saveWeightsForSampler(name: string, options: { ttlSeconds?: number; replaceOldest?: boolean } = {}):
      Promise<{ path: string }> {
    const out = await this.client.saveWeightsForSampler({ name, ttl_seconds: options.ttlSeconds ?? 0,
                                                          replace_oldest: options.replaceOldest ?? false });
    return { path: `streambp://${this.session}/sampler_weights/${out.name}` };
  }

  /**
   * A sampler on a new snapshot, as Tinker's ephemeral sampler weights: a rolling window (the
   * oldest make room, also ones saved by saveWeightsForSampler) and a name used again replaces
   * its snapshot.
   */
  async saveWeightsAndGetSamplingClient(name: string): Promise<SamplingClient> {
    let saved: { path: string };
    try {
      saved = await this.saveWeightsForSampler(name, { replaceOldest: true });
    } catch (e) {
      if (!(e instanceof StreambpError) || e.code !== StreambpError.codes.ALREADY_EXISTS) throw e;
      await this.client.deleteSnapshot({ name });
      saved = await this.saveWeightsForSampler(name, { replaceOldest: true });
    }
    return this.service.createSamplingClient(saved.path);
  }

  /** Samples from this session's current weights (they move as it trains). */
  createSamplingClient(): SamplingClient {
    return new SamplingClient(this.client);
  }
}

export interface ServiceClientOptions extends ClientOptions {
  /** "host:port", with or without http:// (default STREAMBP_SERVER or 127.0.0.1:50051). */
  baseUrl?: string;
  /** The server's bearer token. */
  apiKey?: string;
}

export class ServiceClient {
  readonly client: Client;

  constructor(options: ServiceClientOptions = {}) {
    const { baseUrl, apiKey, ...rest } = options;
    const target = (baseUrl ?? process.env.STREAMBP_SERVER ?? '127.0.0.1:50051').replace(/^(https?|grpc):\/\//, '').replace(/\/$/, '');
    this.client = new Client(target, apiKey === undefined ? rest : { ...rest, token: apiKey });
  }

  close(): void {
    this.client.close();
  }

  /** A new LoRA session of rank `rank` on the server's model (`baseModel` is recorded: a server serves one model). */
  async createLoraTrainingClient(options: { baseModel?: string; rank?: number; seed?: number; name?: string;
                                            lora?: Partial<T.LoraConfig> } = {}): Promise<TrainingClient> {
    const name = options.name ?? `tinker-${randomUUID().slice(0, 12)}`;
    const lora: T.LoraConfig = { ...options.lora, r: options.rank ?? 32 };
    if (options.seed !== undefined) lora.seed = options.seed;
    await this.client.createSession({ name, lora });
    return new TrainingClient(this, this.client.withSession(name), options.baseModel ?? '');
  }

  /** A sampler on a snapshot (saveWeightsForSampler's path), or on the default session. */
  createSamplingClient(modelPath?: string): SamplingClient {
    if (modelPath === undefined) return new SamplingClient(this.client.withSession(''));
    const [session, kind, snapshot, ...rest] = modelPath.startsWith('streambp://')
      ? modelPath.slice('streambp://'.length).split('/') : [];
    if (!session || kind !== 'sampler_weights' || !snapshot || rest.length > 0) {
      throw invalid(`model path ${modelPath}: expected streambp://<session>/sampler_weights/<name> (saveWeightsForSampler's path)`);
    }
    return new SamplingClient(this.client.withSession(session), snapshot);
  }

  /** The server's model and its loss functions (GetInfo.objectives). */
  getServerCapabilities(): Promise<T.GetInfoResponse__Output> {
    return this.client.getInfo();
  }
}
