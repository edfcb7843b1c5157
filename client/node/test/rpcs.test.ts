// Every RPC of streambp.v1.Trainer, called once through the package against a real
// streambp-server: a tiny model around the real Qwen3 tokenizer (text forms, Tokenize),
// sessions (a LoRA session carries the model RPCs), the RL loop (Sample with text prompts,
// PushRollouts + PushRolloutsStream run a server-side GRPO step that WatchPolicy announces),
// progress streams, checkpoints and weights export to a folder. An interceptor records every
// RPC that returned OK (or, for WatchPolicy, which runs until cancelled, gave a message); the
// test ends by checking that none is missing.
import { strict as assert } from 'assert';
import * as fs from 'fs';
import * as path from 'path';
import { after, before, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { Client, StreambpError, tinker as tinkerApi, trainerService, type PolicyUpdate__Output, type StepProgress__Output } from '@streambp/client';
import { missingServer, modelWithTokenizer, startServer, tempDir, type Server } from './helpers';

const skip = missingServer(true) || false;
const succeeded = new Set<string>();
const rpc = (options: grpc.InterceptorOptions): string => options.method_definition.path.split('/').pop() ?? '';
const recorder: grpc.Interceptor = (options, next) => new grpc.InterceptingCall(next(options),
  new grpc.RequesterBuilder().withStart((metadata, _listener, start) => start(metadata,
    new grpc.ListenerBuilder().withOnReceiveMessage((message, onMessage) => {
      if (rpc(options) === 'WatchPolicy') succeeded.add('WatchPolicy');
      onMessage(message);
    }).withOnReceiveStatus((status, onStatus) => {
      if (status.code === grpc.status.OK) succeeded.add(rpc(options));
      onStatus(status);
    }).build())).build());

let server: Server;
let client: Client;
let model = '';

before(async () => {
  if (skip) return;
  model = modelWithTokenizer();
  server = await startServer('rpcs', ['--model', model], (dir) => ({
    checkpoint_dir: path.join(dir, 'checkpoints'),
    sessions: { enabled: true },
  }));
  client = new Client(server.target, { channelOptions: { interceptors: [recorder] } });
});

after(async () => {
  client?.close();
  await server?.stop();
  if (model) fs.rmSync(path.dirname(model), { recursive: true, force: true });
});

test('every RPC once against a real server', { skip }, async () => {
  const info = await client.getInfo();
  assert.equal(info.sessions, true);
  assert.equal(info.tokenizer?.available, true);

  // Sessions: a LoRA adapter on the shared base, with its own RL loop settings.
  const created = await client.createSession({ name: 'node', lora: { r: 2 }, rollouts: { groups_per_step: 2 } });
  assert.equal(created.kind, 'lora');
  const s = client.withSession('node');
  assert.equal((await client.getSession({ name: 'node' })).name, 'node');
  assert.ok((await client.listSessions()).sessions.some((x) => x.name === 'node'));

  // Text.
  const hello = await s.tokenizeText('Hello world');
  assert.ok(hello.ids.length > 0);
  assert.equal(await s.detokenizeIds(hello.ids), 'Hello world');
  const chat = await s.tokenize({ inputs: [{ messages: [{ role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello!' }] }] });
  assert.equal(chat.outputs[0].loss_mask.length, chat.outputs[0].ids.length);
  assert.ok(chat.outputs[0].loss_mask.some((m) => m === 1));
  // A conversation as a Datum's model input: the server tokenizes it; cross_entropy with no
  // other input trains its assistant turn (the rendered mask, less the first entry).
  const conversation = [{ role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello!' }];
  const textDatum = await s.forwardBackward({ objective: 'cross_entropy', batch: { data: { data: [tinkerApi.datum(conversation)] } } });
  assert.equal(Number(textDatum.stats?.targets), chat.outputs[0].loss_mask.slice(1).filter((m) => m === 1).length);
  assert.ok(Number(textDatum.stats?.loss) > 0);

  assert.ok((await s.estimateMemory({ seq_len: 32 })).total_bytes > 0);

  // Steps, with text in the batch.
  const batch = { sft: { examples: [{ text: 'Hello world, this is a test.' }, { prompt: hello.ids, completion: [11, 12, 13] }] } };
  const fb = await s.forwardBackward({ batch });
  assert.ok(fb.stats && fb.stats.targets > 0 && Number.isFinite(fb.stats.loss));
  const optim = await s.optimStep();
  assert.equal(optim.policy_version, 1);
  const step = await s.trainStep({ batch });
  assert.equal(step.optim?.policy_version, 2);
  const states: StepProgress__Output[] = [];
  const withProgress = await s.trainStep({ batch }, { onProgress: (p) => states.push(p) });
  assert.equal(withProgress.optim?.policy_version, 3);
  assert.ok(states.some((p) => p.state === 'backward' && p.num_layers > 0), JSON.stringify(states.map((p) => p.state)));
  let done: StepProgress__Output | undefined;
  for await (const p of s.forwardBackwardProgress({ batch })) done = p;
  assert.equal(done?.state, 'done');
  assert.ok(done?.forward_backward?.stats?.loss);
  // This step with its own Adam parameters (Tinker's AdamParams; unset fields take its defaults).
  const tinker = await s.optimStep({ adam_params: { learning_rate: 2e-3, grad_clip_norm: 1 } });
  assert.equal(tinker.learning_rate, 2e-3);
  assert.equal(tinker.policy_version, 4);

  const logprobs = await s.computeLogprobs({ sequences: [{ tokens: hello.ids }], fp64: true });
  assert.equal(logprobs.sequences[0].logprobs.length, hello.ids.length - 1);
  assert.equal(logprobs.sequences[0].logprobs_fp64.length, hello.ids.length - 1);
  assert.equal(logprobs.policy_version, 4);

  // The RL loop: samples of text prompts, pushed as two groups (one per push RPC), make one
  // server-side step, which WatchPolicy announces.
  const watch = new AbortController();
  const updates: PolicyUpdate__Output[] = [];
  const watching = (async () => {
    for await (const u of s.watchPolicy({ since_version: 4 }, { signal: watch.signal })) {
      updates.push(u);
      if (u.source === 'rollouts') return;
    }
  })();
  const sampled = await s.sampleText(['Hello', [{ role: 'user', content: 'Hi' }]], { n: 2, max_tokens: 4, seed: 7 });
  assert.equal(sampled.completions.length, 4);
  assert.equal(sampled.policy_version, 4);
  assert.ok(sampled.completions.every((c) => typeof c.text === 'string' && c.tokens.length > 0));
  const group = (p: number) => ({
    prompt_text: p === 0 ? { text: 'Hello' } : { messages: [{ role: 'user', content: 'Hi' }] },
    policy_version: sampled.policy_version,
    completions: sampled.completions.filter((c) => c.prompt_index === p)
      .map((c, i) => ({ tokens: c.tokens, logprobs: c.logprobs, reward: i })),
  });
  const pushed = await s.pushRollouts({ groups: [group(0)] });
  assert.equal(pushed.acks[0].status, 'accepted', pushed.acks[0].message);
  const stream = s.pushRolloutsStream();
  const ack = await stream.push(group(1));
  assert.equal(ack.status, 'accepted', ack.message);
  await stream.end();
  await watching;
  watch.abort();
  assert.equal(updates.at(-1)?.source, 'rollouts');
  assert.equal(updates.at(-1)?.groups_consumed, 2);
  const stats = await s.getRolloutStats();
  assert.equal(stats.steps_run, 1);
  assert.equal(stats.consumed, 2);
  // The history: a record per optimizer step, with what each step answered.
  const history = await s.getHistory();
  assert.deepEqual(history.records.map((r) => r.source), ['optim_step', 'train', 'train', 'optim_step', 'rollouts']);
  assert.deepEqual(history.records.map((r) => r.policy_version), [1, 2, 3, 4, 5]);
  assert.equal(history.records[1].loss, step.stats?.loss);
  assert.equal(history.records[1].grad_norm, step.optim?.grad_norm);
  assert.equal(history.records[3].learning_rate, 2e-3);
  assert.equal(history.records[4].groups_consumed, 2);
  assert.ok('reward_mean' in history.records[4].metrics, JSON.stringify(history.records[4].metrics));
  assert.equal(history.last_index, 5);
  assert.ok(history.file.endsWith(path.join('node', 'metrics.jsonl')), history.file);
  assert.deepEqual((await s.getHistory({ after_index: 3 })).records.map((r) => r.index), [4, 5]);

  // State: checkpoints and weights.
  const saved = await s.saveCheckpoint({ name: 'node-ckpt' });
  assert.equal(saved.policy_version, 5);
  assert.equal((await s.loadCheckpoint({ name: 'node-ckpt' })).policy_version, 5);
  let format = '';
  let bytes = 0;
  for await (const chunk of s.exportWeights()) {
    if (!chunk.file) bytes += chunk.data.length;
    format ||= chunk.format;
  }
  assert.equal(format, 'peft_adapter');
  assert.ok(bytes > 0);
  const dir = tempDir('export');
  const exported = await s.exportWeightsToFolder(dir, { merged: true });
  assert.equal(exported.format, 'model');
  assert.equal(exported.policy_version, 5);
  for (const name of ['model.safetensors', 'config.json', 'tokenizer.json']) {
    assert.ok(fs.existsSync(path.join(dir, name)), `${name} in ${fs.readdirSync(dir).join(' ')}`);
  }
  fs.rmSync(dir, { recursive: true });

  // Sampler snapshots: frozen weights that sample while the session trains on.
  const snap = await s.saveWeightsForSampler({ name: 'v5' });
  assert.equal(snap.policy_version, 5);
  assert.ok(Number(snap.bytes) > 0);
  assert.deepEqual((await s.listSnapshots()).snapshots.map((x) => x.name), ['v5']);
  const fromSnapshot = await s.sample({ prompts: [{ tokens: [1, 2, 3] }], max_tokens: 2, seed: 3, snapshot: 'v5' });
  assert.equal(fromSnapshot.policy_version, 5);
  assert.equal((await s.deleteSnapshot({ name: 'v5' })).name, 'v5');
  assert.deepEqual((await s.listSnapshots()).snapshots, []);

  assert.equal((await client.deleteSession({ name: 'node' })).name, 'node');
  await assert.rejects(client.getSession({ name: 'node' }), (e: StreambpError) => e.code === grpc.status.NOT_FOUND);

  const missing = Object.keys(trainerService()).filter((rpc) => !succeeded.has(rpc));
  assert.deepEqual(missing, [], `RPCs never called with success: ${missing.join(', ')}`);
});
