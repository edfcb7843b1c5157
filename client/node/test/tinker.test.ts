// Tinker's client surface from Node (tinker.ServiceClient / TrainingClient / SamplingClient)
// against a real server with sessions, Tinker-shaped calls only: the supervised loop's
// loss:sum falls, the RL loop (snapshot -> sample -> reward -> importance_sampling) raises the
// mean reward, and a snapshot samples the same before and after its session trains on.
import { strict as assert } from 'assert';
import * as path from 'path';
import { after, before, test } from 'node:test';
import { tinker } from '@streambp/client';
import { missingServer, startServer, type Server } from './helpers';

const skip = missingServer() || false;
const TARGETS = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj', 'lm_head'];
let server: Server;
let service: tinker.ServiceClient;

before(async () => {
  if (skip) return;
  server = await startServer('tinker', ['--dtype', 'float64'], (dir) => ({
    log: { level: 'warn' }, checkpoint_dir: path.join(dir, 'checkpoints'), sessions: { enabled: true, max_sessions: 8 },
  }));
  service = new tinker.ServiceClient({ baseUrl: `http://${server.target}` });
});

after(async () => {
  service?.close();
  await server?.stop();
});

const evenShare = (tokens: number[]): number => tokens.filter((t) => t % 2 === 0).length / Math.max(1, tokens.length);

test('the supervised loop learns and a snapshot stays frozen', { skip }, async () => {
  const training = await service.createLoraTrainingClient({ baseModel: 'tiny', rank: 8, seed: 1,
                                                            lora: { alpha: 16, target_modules: TARGETS } });
  const examples: Array<[number[], number[]]> = [[[3, 7, 11], [20, 22, 24, 26]], [[5, 9], [30, 31, 32]]];
  const data = examples.map(([prompt, completion]) => {
    const tokens = [...prompt, ...completion];
    const weights = tokens.slice(1).map((_, t) => (t < prompt.length - 1 ? 0 : 1));
    return tinker.datum(tokens.slice(0, -1), { target_tokens: tokens.slice(1), weights });
  });
  const losses: number[] = [];
  for (let step = 0; step < 10; step++) {
    const fb = await training.forwardBackward(data, 'cross_entropy');
    losses.push(fb.metrics['loss:sum'] ?? NaN);
    if (step === 0) {
      // Per-datum log-probs (loss_fn_outputs): one per input token, and loss:sum = -sum w logp.
      assert.deepEqual(fb.loss_fn_outputs.map((o) => o.logprobs.length), [6, 4]);
      let sum = 0;
      fb.loss_fn_outputs.forEach((o, i) => o.logprobs.forEach((lp, t) => {
        sum -= Number((data[i]?.loss_fn_inputs?.weights as { float_data: number[] }).float_data[t]) * lp;
      }));
      assert.ok(Math.abs(sum - (fb.metrics['loss:sum'] ?? NaN)) < 1e-9 * Math.abs(sum), `${sum} vs ${fb.metrics['loss:sum']}`);
    }
    await training.optimStep({ learning_rate: 0.02 });
  }
  const first = losses[0] ?? NaN;
  const last = losses[losses.length - 1] ?? NaN;
  console.log(`supervised: loss:sum ${first.toFixed(3)} -> ${last.toFixed(3)}`);
  assert.ok(last < 0.5 * first, `loss:sum ${first} -> ${last}`);

  const sampler = await training.saveWeightsAndGetSamplingClient('frozen');
  const params = { max_tokens: 6, seed: 7 };
  const before0 = await sampler.sample([9, 8, 7], 3, params);
  await training.forwardBackward(data, 'cross_entropy');
  await training.optimStep({ learning_rate: 0.05 });
  const again = await sampler.sample([9, 8, 7], 3, params);
  assert.deepEqual(again, before0, 'the snapshot samples the same after its session trained');
  assert.notDeepEqual(await training.createSamplingClient().computeLogprobs([9, 8, 7, 6]),
                      await sampler.computeLogprobs([9, 8, 7, 6]), 'the session moved on');
});

test('distillation: cross_entropy on 2-D top-k targets is the sum over the candidates', { skip }, async () => {
  const training = await service.createLoraTrainingClient({ rank: 4, seed: 3, lora: { alpha: 8, target_modules: TARGETS } });
  // The teacher's top-3 at each position of the input (here the model's own, as a teacher's
  // would come): the input plus one token, so that each of its 5 positions has candidates.
  const input = [12, 40, 7, 99, 3];
  const k = 3;
  const top = await training.client.computeLogprobs({ sequences: [{ tokens: [...input, 0] }], fp64: true, top_k: k });
  const ids = top.sequences[0]?.top_ids ?? [];
  const lps = (top.sequences[0]?.top_logprobs ?? []).map(Number);
  assert.equal(ids.length, input.length * k);
  const rows = (xs: number[]): number[][] => input.map((_, t) => xs.slice(t * k, (t + 1) * k));
  const weights = lps.map((lp) => Math.exp(lp));  // the teacher's probabilities
  const want = -weights.reduce((sum, w, e) => sum + w * (lps[e] ?? NaN), 0);
  const fb = await training.forwardBackward([tinker.datum(input, { target_tokens: rows(ids), weights: rows(weights) })],
                                            'cross_entropy');
  const got = fb.metrics['loss:sum'] ?? NaN;
  assert.ok(Math.abs(got - want) < 1e-9 * Math.abs(want), `${got} vs ${want}`);
  // loss_fn_outputs: the candidates' log-probs, [N, K], the teacher's here.
  assert.deepEqual(fb.loss_fn_outputs[0]?.shape, [input.length, k]);
  fb.loss_fn_outputs[0]?.logprobs.forEach((lp, e) => assert.ok(Math.abs(lp - (lps[e] ?? NaN)) < 1e-12, `${e}: ${lp}`));
  assert.throws(() => tinker.datum(input, { target_tokens: [[1, 2], [3]], weights: rows(weights) }), /has 1 entries; the rows before it have 2/);
});

test('the RL loop raises the reward (importance_sampling on the sampler\'s log-probs)', { skip }, async () => {
  const training = await service.createLoraTrainingClient({ rank: 8, seed: 2, lora: { alpha: 16, target_modules: TARGETS } });
  const prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]];
  const means: number[] = [];
  for (let step = 0; step < 16; step++) {
    const sampler = await training.saveWeightsAndGetSamplingClient(`rl-${step}`);
    const groups = await Promise.all(prompts.map((p, i) => sampler.sample(p, 4, { max_tokens: 8, seed: 100 * step + i })));
    const data = [];
    let total = 0;
    let count = 0;
    for (const [i, group] of groups.entries()) {
      const prompt = prompts[i] ?? [];
      const rewards = group.sequences.map((s) => evenShare(s.tokens));
      const mean = rewards.reduce((a, b) => a + b, 0) / rewards.length;
      total += rewards.reduce((a, b) => a + b, 0);
      count += rewards.length;
      for (const [k, s] of group.sequences.entries()) {
        const tokens = [...prompt, ...s.tokens];
        const pad = new Array<number>(prompt.length - 1).fill(0);
        data.push(tinker.datum(tokens.slice(0, -1), {
          target_tokens: tokens.slice(1),
          logprobs: [...pad, ...s.logprobs],
          advantages: [...pad, ...s.tokens.map(() => (rewards[k] ?? 0) - mean)],
        }));
      }
    }
    means.push(total / count);
    await training.forwardBackward(data, 'importance_sampling');
    await training.optimStep({ learning_rate: 0.05 });
  }
  // A rolling window of samplers: at sessions.max_snapshots (8) the oldest made room.
  const kept = await training.client.listSnapshots();
  assert.deepEqual(kept.snapshots.map((s) => s.name), Array.from({ length: 8 }, (_, i) => `rl-${i + 8}`));
  const avg = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / xs.length;
  const first = avg(means.slice(0, 4));
  const last = avg(means.slice(-4));
  console.log(`RL: mean reward ${first.toFixed(3)} -> ${last.toFixed(3)}`);
  assert.ok(last > first + 0.15, `mean reward ${first} -> ${last}: ${means.join(', ')}`);
});
