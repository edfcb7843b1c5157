// forwardBackwardCustom is exact: a hand-written SFT loss (L = -(1/N) Σ logp over the target
// tokens), computed here on the server's float64 log-probs, gives the same loss and the same
// SGD update as the built-in sft objective (two float64 servers from the same embedded
// model), within 1e-10 relative; and weights computed on an older policy are refused.
import { strict as assert } from 'assert';
import * as path from 'path';
import * as fs from 'fs';
import { after, before, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { Client, StreambpError, type CustomLossOutput, type SftExample } from '@streambp/client';
import { missingServer, readSafetensors, startServer, tempDir, type Server } from './helpers';

const skip = missingServer() || false;
const FLAGS = ['--dtype', 'float64', '--optimizer', 'sgd', '--lr', '0.5'];
const TOLERANCE = 1e-10;

const examples: SftExample[] = [
  { tokens: [1, 5, 9, 13, 17, 21, 25, 29, 33, 37], loss_mask: [0, 0, 1, 1, 1, 1, 1, 1, 1, 1] },
  { prompt: [2, 4, 6], completion: [8, 10, 12, 14] },
];
// The same as sequences and, per log-prob position, whether it is a target.
const sequences = [[1, 5, 9, 13, 17, 21, 25, 29, 33, 37], [2, 4, 6, 8, 10, 12, 14]];
const targets = [[0, 1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]];

function sftLoss(logprobs: number[][]): CustomLossOutput {
  const n = targets.flat().reduce((a, b) => a + b, 0);
  let loss = 0;
  const grads = logprobs.map((seq, i) => seq.map((lp, t) => {
    loss -= (targets[i][t] * lp) / n;
    return -targets[i][t] / n;
  }));
  return { loss, grads };
}

async function weights(client: Client): Promise<Map<string, Float64Array>> {
  const dir = tempDir('weights');
  try {
    await client.exportWeightsToFolder(dir, { with_files: false });
    return readSafetensors(path.join(dir, 'model.safetensors'));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

let a: Server;
let b: Server;
let builtin: Client;
let custom: Client;

before(async () => {
  if (skip) return;
  [a, b] = await Promise.all([startServer('sft', FLAGS), startServer('custom', FLAGS)]);
  builtin = new Client(a.target);
  custom = new Client(b.target);
});

after(async () => {
  builtin?.close();
  custom?.close();
  await Promise.all([a?.stop(), b?.stop()]);
});

test('a custom SFT loss gives the built-in SFT update (float64, SGD, 1e-10)', { skip }, async () => {
  const w0 = await weights(builtin);
  const sft = await builtin.trainStep({ batch: { sft: { examples } } });
  const result = await custom.forwardBackwardCustom(sequences, sftLoss);
  const optim = await custom.optimStep();
  assert.equal(optim.policy_version, sft.optim?.policy_version);
  const sftValue = sft.stats?.loss ?? NaN;
  assert.ok(Math.abs(result.loss - sftValue) <= TOLERANCE * Math.abs(sftValue), `${result.loss} vs ${sftValue}`);
  const serverSide = result.forward_backward.stats?.loss ?? NaN;  // Σ w·logp on the server
  assert.ok(Math.abs(serverSide - sftValue) <= TOLERANCE * Math.abs(sftValue), `${serverSide} vs ${sftValue}`);

  const [wa, wb] = await Promise.all([weights(builtin), weights(custom)]);
  let diff = 0;
  let norm = 0;
  for (const [name, before0] of w0) {
    const x = wa.get(name);
    const y = wb.get(name);
    assert.ok(x && y, name);
    for (let i = 0; i < before0.length; i++) {
      const da = x[i] - before0[i];
      diff += (da - (y[i] - before0[i])) ** 2;
      norm += da ** 2;
    }
  }
  assert.ok(norm > 0, 'the SFT step changed nothing');
  const relative = Math.sqrt(diff / norm);
  console.log(`loss ${sftValue}: update relative difference ${relative.toExponential(3)} (tolerance ${TOLERANCE})`);
  assert.ok(relative <= TOLERANCE, `relative difference of the updates ${relative}`);
});

test('weights computed on an older policy version are refused', { skip }, async () => {
  const before0 = (await custom.getInfo()).policy_version;
  await assert.rejects(custom.forwardBackwardCustom(sequences, async (logprobs) => {
    await custom.trainStep({ batch: { sft: { examples } } });  // the policy moves meanwhile
    return sftLoss(logprobs);
  }), (e: unknown) => {
    assert.ok(e instanceof StreambpError);
    assert.equal(e.codeName, 'FAILED_PRECONDITION', e.message);
    return true;
  });
  const info = await custom.getInfo();
  assert.equal(info.policy_version, before0 + 1);
  assert.equal(info.pending_micro_batches, 0);
  assert.equal(grpc.status.FAILED_PRECONDITION, StreambpError.codes.FAILED_PRECONDITION);
});

test('a data batch (Datum) for cross_entropy: loss -Σ w·logp, its config by name, bad inputs named', { skip }, async () => {
  // Tinker's shape: the model reads all but the last token, target_tokens are the rest, one weight each.
  const data = sequences.map((seq, i) => ({
    model_input: { tokens: seq.slice(0, -1) },
    loss_fn_inputs: {
      target_tokens: { int_data: seq.slice(1) },
      weights: { float_data: targets[i].map((t, k) => t * (1 + k / 8)) },
    },
  }));
  const lp = await builtin.computeLogprobs({ sequences: sequences.map((tokens) => ({ tokens })), fp64: true });
  let expected = 0;
  lp.sequences.forEach((s, i) => s.logprobs_fp64.forEach((x, t) => { expected -= data[i].loss_fn_inputs.weights.float_data[t] * x; }));
  const fb = await builtin.forwardBackward({ objective: 'cross_entropy', batch: { data: { data } } });
  const loss = fb.stats?.loss ?? NaN;
  assert.ok(Math.abs(loss - expected) <= TOLERANCE * Math.abs(expected), `${loss} vs ${expected}`);
  await assert.rejects(builtin.forwardBackward({
    objective: 'cross_entropy', batch: { data: { data } }, loss_fn_config: { temperature: { number: 2 } },
  }), (e: unknown) => {
    assert.ok(e instanceof StreambpError);
    assert.equal(e.codeName, 'INVALID_ARGUMENT', e.message);
    assert.match(e.message, /temperature/);
    return true;
  });
  const short = [{ ...data[0], loss_fn_inputs: { ...data[0].loss_fn_inputs, weights: { float_data: [1] } } }];
  await assert.rejects(builtin.forwardBackward({ objective: 'cross_entropy', batch: { data: { data: short } } }),
    (e: unknown) => {
      assert.ok(e instanceof StreambpError);
      assert.equal(e.codeName, 'INVALID_ARGUMENT', e.message);
      assert.match(e.message, /batch\.data\.data\[0\]\.loss_fn_inputs\[weights\] has 1 values but model_input has 9 tokens/);
      return true;
    });
  await builtin.optimStep();  // the gradients of the first call
});
