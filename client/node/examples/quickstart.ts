// First calls and a short training loop: GetInfo, SFT TrainStep (with progress), ComputeLogprobs.
//   npm run build && npm run build:dev
//   node build/examples/quickstart.js --server 127.0.0.1:50051 [--steps N] [--json]
// The token comes from STREAMBP_TOKEN when the server wants one.
import { Client, StreambpError, type SftExample, type StepProgress__Output } from '@streambp/client';

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

async function main(): Promise<void> {
  const target = arg('--server', process.env.STREAMBP_SERVER ?? '127.0.0.1:50051');
  const steps = Number(arg('--steps', '1'));
  const asJson = process.argv.includes('--json');
  const client = new Client(target, { token: process.env.STREAMBP_TOKEN });
  try {
    const info = await client.getInfo();
    const examples: SftExample[] = [
      { tokens: [1, 5, 9, 13, 17, 21, 25, 29, 33, 37], loss_mask: [0, 0, 1, 1, 1, 1, 1, 1, 1, 1] },
      { prompt: [2, 4, 6], completion: [8, 10, 12, 14] },
    ];
    const show = (p: StepProgress__Output): void => {
      if (!asJson && p.state === 'backward') process.stderr.write(`\r  backward layer ${p.layer + 1}/${p.num_layers}`);
    };
    let step = await client.trainStep({ batch: { sft: { examples } } }, { onProgress: show });
    for (let i = 1; i < steps; i++) step = await client.trainStep({ batch: { sft: { examples } } }, { onProgress: show });
    if (!asJson) process.stderr.write('\r\x1b[K');
    const logprobs = await client.computeLogprobs({ sequences: [{ tokens: [1, 2, 3, 4, 5] }] });
    const result = {
      architecture: info.architecture, vocab_size: info.vocab_size, dtype: info.dtype,
      loss: step.stats?.loss ?? NaN, targets: step.stats?.targets ?? 0, policy_version: step.optim?.policy_version ?? 0,
      logprobs: logprobs.sequences[0].logprobs,
    };
    if (asJson) {
      console.log(JSON.stringify(result));
    } else {
      console.log(`${info.architecture} (${info.vocab_size} tokens, ${info.dtype}) at ${target}`);
      console.log(`TrainStep: loss ${result.loss.toFixed(6)} over ${result.targets} targets -> policy v${result.policy_version}`);
      console.log(`ComputeLogprobs [1..5]: ${result.logprobs.map((x) => x.toFixed(4)).join(' ')}`);
    }
  } finally {
    client.close();
  }
}

main().catch((error: unknown) => {
  const e = error as StreambpError;
  console.error(`error: ${e instanceof StreambpError ? `${e.codeName}: ` : ''}${e.message}`);
  process.exit(1);
});
