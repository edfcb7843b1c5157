// The RL loop with the server as trainer and sampler: sample completions of text prompts,
// score them here, push them as GRPO groups; the server runs a GRPO step every
// rollouts.groups_per_step groups and announces each new policy version (WatchPolicy).
//   node build/examples/rl_loop.js --server 127.0.0.1:50051 [--versions 5]
// Needs a model with a tokenizer (serve --model DIR). The reward: short completions.
import { Client, type Completion__Output, type RolloutGroup } from '@streambp/client';

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

function reward(completion: Completion__Output): number {
  return 1 / (1 + completion.text.length);
}

async function main(): Promise<void> {
  const client = new Client(arg('--server', '127.0.0.1:50051'), { token: process.env.STREAMBP_TOKEN });
  const versions = Number(arg('--versions', '5'));
  const prompts = ['The capital of France is', 'Two plus two equals'];
  const stats = await client.getRolloutStats();
  console.log(`rollouts: ${stats.groups_per_step} groups per step, max staleness ${stats.max_staleness}`);

  // Announcements of new versions, in the background.
  const watch = new AbortController();
  const updates = (async () => {
    try {
      for await (const update of client.watchPolicy({ since_version: stats.policy_version }, { signal: watch.signal })) {
        console.log(`policy v${update.policy_version} (${update.source}): loss ${update.loss.toFixed(4)}, ` +
                    `reward ${update.reward_mean.toFixed(4)}, kl ${update.kl.toFixed(4)}`);
      }
    } catch (e) {
      if (!watch.signal.aborted) throw e;
    }
  })();

  const stream = client.pushRolloutsStream();
  while ((await client.getInfo()).policy_version < stats.policy_version + versions) {
    const sampled = await client.sampleText(prompts, { n: 4, max_tokens: 16, temperature: 1 });
    const groups = prompts.map((prompt, p): RolloutGroup => ({
      prompt_text: { text: prompt },
      policy_version: sampled.policy_version,
      completions: sampled.completions.filter((c) => c.prompt_index === p)
        .map((c) => ({ tokens: c.tokens, logprobs: c.logprobs, reward: reward(c) })),
    }));
    const acks = await Promise.all(groups.map((g) => stream.push(g)));
    for (const ack of acks) if (ack.status !== 'accepted') console.log(`group ${ack.index}: ${ack.status} ${ack.message}`);
  }
  await stream.end();
  watch.abort();
  await updates;
  client.close();
}

main().catch((e: unknown) => {
  console.error(`error: ${(e as Error).toString()}`);
  process.exit(1);
});
