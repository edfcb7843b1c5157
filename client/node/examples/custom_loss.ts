// A loss the server does not know, trained exactly: forwardBackwardCustom computes the
// log-probs (double precision), calls the loss here, and sends dL/dlogp to the server.
// The loss: REINFORCE with a per-sequence advantage, L = -(1/N) Σ_i A_i Σ_t logp_i,t.
//   node build/examples/custom_loss.js --server 127.0.0.1:50051
import { Client, type CustomLossOutput } from '@streambp/client';

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

function reinforce(advantages: number[]) {
  return (logprobs: number[][]): CustomLossOutput => {
    const n = logprobs.length;
    let loss = 0;
    const grads = logprobs.map((seq, i) => seq.map((lp) => {
      loss -= (advantages[i] * lp) / n;
      return -advantages[i] / n;
    }));
    return { loss, grads };
  };
}

async function main(): Promise<void> {
  const client = new Client(arg('--server', '127.0.0.1:50051'), { token: process.env.STREAMBP_TOKEN });
  const sequences = [[1, 5, 9, 13, 17], [2, 4, 6, 8, 10, 12]];
  for (let step = 0; step < 3; step++) {
    const result = await client.forwardBackwardCustom(sequences, reinforce([1, -0.5]));
    const optim = await client.optimStep();
    console.log(`step ${optim.step}: loss ${result.loss.toFixed(6)} (server Σw·logp ` +
                `${result.forward_backward.stats?.loss.toFixed(6)}) -> policy v${optim.policy_version}`);
  }
  client.close();
}

main().catch((e: unknown) => {
  console.error(`error: ${(e as Error).toString()}`);
  process.exit(1);
});
