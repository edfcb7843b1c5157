// The client's mechanics against an in-process gRPC server that plays the Trainer service
// (no streambp-server needed): method coverage, request ids kept across retries, errors,
// deadlines, progress, export verification, the rollout stream, WatchPolicy resumption.
import { strict as assert } from 'assert';
import * as fs from 'fs';
import * as path from 'path';
import { createHash } from 'crypto';
import { test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import {
  Client, LOADER_OPTIONS, METHODS, StreambpError, retryPolicy, serviceConfig, trainerService,
  type RolloutAck, type RolloutGroup__Output, type StepProgress, type TrainStepRequest__Output, type WeightsChunk,
} from '@streambp/client';
import { tempDir } from './helpers';

// eslint-disable-next-line @typescript-eslint/no-require-imports
const { FLAGS } = require('../../scripts/gen-types.js') as { FLAGS: string[] };

type Handlers = Record<string, grpc.UntypedHandleCall>;

async function withServer(handlers: Handlers, body: (client: Client) => Promise<void>,
                          options: ConstructorParameters<typeof Client>[1] = {}): Promise<void> {
  const server = new grpc.Server();
  server.addService(trainerService(), handlers);
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
  const client = new Client(`127.0.0.1:${port}`, { retry: { initialBackoffSeconds: 0.01 }, ...options });
  try {
    await body(client);
  } finally {
    client.close();
    server.forceShutdown();
  }
}

const lowerFirst = (s: string): string => s[0].toLowerCase() + s.slice(1);
const status = (code: grpc.status, details: string): Partial<grpc.StatusObject> => ({ code, details });

test('every RPC of the proto has a method, and the table of RPCs is the proto\'s', () => {
  const rpcs = Object.keys(trainerService()).sort();
  assert.deepEqual(Object.keys(METHODS).sort(), rpcs);
  const client = new Client('127.0.0.1:1');
  for (const rpc of rpcs) assert.equal(typeof (client as unknown as Record<string, unknown>)[lowerFirst(rpc)], 'function', rpc);
  client.close();
});

test('the runtime loader options are the ones the types were generated with', () => {
  const expected = ['--keepCase', '--longs=Number', '--defaults', '--oneofs'];
  for (const flag of expected) assert.ok(FLAGS.includes(flag), `gen-types.js lacks ${flag}`);
  assert.deepEqual({ ...LOADER_OPTIONS }, { keepCase: true, longs: Number, defaults: true, oneofs: true });
});

test('retry policy: the service config gRPC gets, and validation', () => {
  const config = JSON.parse(serviceConfig(retryPolicy({})) ?? 'null');
  assert.deepEqual(config, {
    methodConfig: [{
      name: [{ service: 'streambp.v1.Trainer' }],
      retryPolicy: { maxAttempts: 5, initialBackoff: '0.200000000s', maxBackoff: '5.000000000s', backoffMultiplier: 2,
                     retryableStatusCodes: ['UNAVAILABLE'] },
    }],
  });
  const custom = JSON.parse(serviceConfig(retryPolicy({ maxAttempts: 3, initialBackoffSeconds: 0.001 })) ?? 'null');
  assert.equal(custom.methodConfig[0].retryPolicy.maxAttempts, 3);
  assert.equal(custom.methodConfig[0].retryPolicy.initialBackoff, '0.001000000s');
  assert.equal(serviceConfig(retryPolicy({ maxAttempts: 1 })), null);
  for (const bad of [{ maxAttempts: 0 }, { maxAttempts: 6 }, { maxAttempts: 2.5 }]) {
    assert.throws(() => retryPolicy(bad), (e: StreambpError) =>
      e.code === grpc.status.INVALID_ARGUMENT && e.message.includes('retry.maxAttempts'));
  }
  assert.throws(() => retryPolicy({ initialBackoffSeconds: 0 }), (e: StreambpError) =>
    e.message.includes('retry.initialBackoffSeconds'));
  assert.throws(() => new Client('127.0.0.1:1', { retry: { multiplier: 0.5 } }), (e: StreambpError) =>
    e.code === grpc.status.INVALID_ARGUMENT && e.message.includes('retry.multiplier'));
});

test('UNAVAILABLE is retried with the same request id; session, token and metadata are sent', async () => {
  const seen: TrainStepRequest__Output[] = [];
  const auth: string[] = [];
  await withServer({
    TrainStep: (call: grpc.ServerUnaryCall<TrainStepRequest__Output, unknown>, cb: grpc.sendUnaryData<unknown>) => {
      seen.push(call.request);
      auth.push(String(call.metadata.get('authorization')[0]));
      if (seen.length < 3) cb(status(grpc.status.UNAVAILABLE, 'try again'));
      else cb(null, { stats: { loss: 1.5 }, optim: { policy_version: 7 } });
    },
  }, async (client) => {
    const step = await client.trainStep({ batch: { sft: { examples: [{ tokens: [1, 2] }] } } });
    assert.equal(step.optim?.policy_version, 7);
    assert.equal(step.stats?.loss, 1.5);
  }, { token: 'secret', session: 'alice' });
  assert.equal(seen.length, 3);
  assert.match(seen[0].request_id, /^[0-9a-f]{32}$/);
  assert.ok(seen.every((r) => r.request_id === seen[0].request_id && r.session === 'alice'));
  assert.deepEqual(auth, ['Bearer secret', 'Bearer secret', 'Bearer secret']);
});

test('errors: one class with the code and the server\'s message; not retried unless UNAVAILABLE', async () => {
  let calls = 0;
  await withServer({
    GetInfo: (_call: unknown, cb: grpc.sendUnaryData<unknown>) => {
      calls++;
      cb(status(grpc.status.INVALID_ARGUMENT, 'batch.sft.examples[0].tokens[2] = 256 is outside the vocabulary [0, 256)'));
    },
    OptimStep: (_call: unknown, cb: grpc.sendUnaryData<unknown>) => cb(status(grpc.status.UNAVAILABLE, 'down')),
  }, async (client) => {
    await assert.rejects(client.getInfo(), (e: unknown) => {
      assert.ok(e instanceof StreambpError);
      assert.equal(e.code, grpc.status.INVALID_ARGUMENT);
      assert.equal(e.codeName, 'INVALID_ARGUMENT');
      assert.equal(e.message, 'batch.sft.examples[0].tokens[2] = 256 is outside the vocabulary [0, 256)');
      assert.equal(e.method, 'GetInfo');
      return true;
    });
    assert.equal(calls, 1);
  });
});

test('retries: maxAttempts in all, none when 1, and a batch over 256 KiB is retried with its request id', async () => {
  const ids: string[] = [];
  let optimCalls = 0;
  const handlers = {
    OptimStep: (_call: unknown, cb: grpc.sendUnaryData<unknown>) => {
      optimCalls++;
      cb(status(grpc.status.UNAVAILABLE, 'down'));
    },
    TrainStep: (call: grpc.ServerUnaryCall<TrainStepRequest__Output, unknown>, cb: grpc.sendUnaryData<unknown>) => {
      ids.push(call.request.request_id);
      if (ids.length < 2) cb(status(grpc.status.UNAVAILABLE, 'try again'));
      else cb(null, { stats: { loss: 0.5 } });
    },
  };
  await withServer(handlers, async (client) => {
    await assert.rejects(client.optimStep({}), (e: StreambpError) => e.code === grpc.status.UNAVAILABLE);
    assert.equal(optimCalls, 2);
    const tokens = Array.from({ length: 400000 }, (_, i) => 100000 + i);  // ~1.2 MB on the wire
    const step = await client.trainStep({ batch: { sft: { examples: [{ tokens }] } } });
    assert.equal(step.stats?.loss, 0.5);
    assert.equal(ids.length, 2);
    assert.match(ids[0], /^[0-9a-f]{32}$/);
    assert.ok(ids.every((id) => id === ids[0]));
  }, { retry: { maxAttempts: 2, initialBackoffSeconds: 0.01 } });
  optimCalls = 0;
  await withServer(handlers, async (client) => {
    await assert.rejects(client.optimStep({}), (e: StreambpError) => e.code === grpc.status.UNAVAILABLE);
    assert.equal(optimCalls, 1);
  }, { retry: { maxAttempts: 1 } });
});

test('deadlines and cancellation', async () => {
  await withServer({
    GetInfo: () => undefined,  // never answers
    ComputeLogprobs: () => undefined,
  }, async (client) => {
    const t0 = Date.now();
    await assert.rejects(client.getInfo({}, { deadlineSeconds: 0.2 }),
                         (e: StreambpError) => e.code === grpc.status.DEADLINE_EXCEEDED);
    assert.ok(Date.now() - t0 < 5000);
    const abort = new AbortController();
    setTimeout(() => abort.abort(), 100);
    await assert.rejects(client.computeLogprobs({ sequences: [] }, { signal: abort.signal }),
                         (e: StreambpError) => e.code === grpc.status.CANCELLED);
  });
});

test('trainStep with onProgress: progress before "done", the answer from "done"; UNIMPLEMENTED falls back', async () => {
  const ids: string[] = [];
  await withServer({
    TrainStepProgress: (call: grpc.ServerWritableStream<TrainStepRequest__Output, StepProgress>) => {
      ids.push(call.request.request_id);
      call.write({ state: 'queued', queue_position: 1 });
      call.write({ state: 'started' });
      call.write({ state: 'backward', layer: 1, num_layers: 2 });
      call.write({ state: 'done', train_step: { stats: { loss: 2.25 }, optim: { policy_version: 3 } } });
      call.end();
    },
  }, async (client) => {
    const seen: string[] = [];
    const step = await client.trainStep({ batch: {} }, { onProgress: (p) => seen.push(p.state) });
    assert.deepEqual(seen, ['queued', 'started', 'backward']);
    assert.equal(step.stats?.loss, 2.25);
    assert.match(ids[0], /^[0-9a-f]{32}$/);
  });
  await withServer({  // a server from before the progress RPCs
    ForwardBackward: (call: grpc.ServerUnaryCall<{ request_id: string }, unknown>, cb: grpc.sendUnaryData<unknown>) => {
      ids.push(call.request.request_id);
      cb(null, { policy_version: 4 });
    },
  }, async (client) => {
    const seen: string[] = [];
    const fb = await client.forwardBackward({ request_id: 'fixed' }, { onProgress: (p) => seen.push(p.state) });
    assert.equal(fb.policy_version, 4);
    assert.deepEqual(seen, []);
    assert.equal(ids.at(-1), 'fixed');
  });
});

function weightsStream(call: grpc.ServerWritableStream<unknown, WeightsChunk>, corrupt: boolean): void {
  const weights = Buffer.from('0123456789abcdef');
  const tokenizer = Buffer.from('{"model": {}}');
  const sha = (b: Buffer): string => createHash('sha256').update(b).digest('hex');
  call.write({ policy_version: 5, total_bytes: weights.length, offset: 0, data: weights.subarray(0, 10), format: 'model' });
  call.write({ offset: 10, data: weights.subarray(10), last: true, sha256: sha(weights), config_json: '{"a": 1}' });
  call.write({ file: 'tokenizer.json', total_bytes: tokenizer.length, offset: 0, data: tokenizer, last: true,
               sha256: corrupt ? sha(weights) : sha(tokenizer) });
  call.end();
}

test('exportWeightsToFolder verifies every file and leaves nothing behind on DATA_LOSS', async () => {
  await withServer({ ExportWeights: (call: grpc.ServerWritableStream<unknown, WeightsChunk>) => weightsStream(call, false) },
                   async (client) => {
    const dir = tempDir('export');
    const out = await client.exportWeightsToFolder(dir);
    assert.deepEqual(out.files, ['model.safetensors', 'config.json', 'tokenizer.json']);
    assert.equal(out.policy_version, 5);
    assert.equal(fs.readFileSync(path.join(dir, 'model.safetensors'), 'utf8'), '0123456789abcdef');
    assert.deepEqual(fs.readdirSync(dir).sort(), ['config.json', 'model.safetensors', 'tokenizer.json']);
    fs.rmSync(dir, { recursive: true });
  });
  await withServer({ ExportWeights: (call: grpc.ServerWritableStream<unknown, WeightsChunk>) => weightsStream(call, true) },
                   async (client) => {
    const dir = tempDir('export');
    await assert.rejects(client.exportWeightsToFolder(dir), (e: StreambpError) =>
      e.code === grpc.status.DATA_LOSS && e.message.includes('tokenizer.json'));
    assert.deepEqual(fs.readdirSync(dir), []);
    fs.rmSync(dir, { recursive: true });
  });
});

test('pushRolloutsStream: one ack per group, in order; the session fills in', async () => {
  const sessions: string[] = [];
  await withServer({
    PushRolloutsStream: (call: grpc.ServerDuplexStream<RolloutGroup__Output, RolloutAck>) => {
      let index = 0;
      call.on('data', (g: RolloutGroup__Output) => {
        sessions.push(g.session);
        call.write({ index: index++, group_id: g.group_id, status: 'accepted', queue_depth: index });
      });
      call.on('end', () => call.end());
    },
  }, async (client) => {
    const stream = client.withSession('bob').pushRolloutsStream();
    const tap = stream.acks();
    const acks = await Promise.all(['a', 'b', 'c'].map((id) => stream.push({ group_id: id, completions: [] })));
    assert.deepEqual(acks.map((a) => a.group_id), ['a', 'b', 'c']);
    await stream.end();
    const tapped: string[] = [];
    for await (const ack of tap) tapped.push(ack.group_id);
    assert.deepEqual(tapped, ['a', 'b', 'c']);
  });
  assert.deepEqual(sessions, ['bob', 'bob', 'bob']);
});

test('watchPolicy resumes after UNAVAILABLE from the last version seen', async () => {
  const since: number[] = [];
  await withServer({
    WatchPolicy: (call: grpc.ServerWritableStream<{ since_version: number }, unknown>) => {
      since.push(call.request.since_version);
      if (since.length === 1) {
        call.write({ policy_version: 1, source: 'train' });
        setTimeout(() => call.emit('error', { code: grpc.status.UNAVAILABLE, details: 'restarting' }), 50);
      } else {
        call.write({ policy_version: 2, source: 'rollouts' });
        call.end();
      }
    },
  }, async (client) => {
    const versions: number[] = [];
    for await (const update of client.watchPolicy()) versions.push(update.policy_version);
    assert.deepEqual(versions, [1, 2]);
  });
  assert.deepEqual(since, [0, 1]);
});
