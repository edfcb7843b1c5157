// Routing replay from Node against a real streambp-server (the tiny qwen3_moe preset,
// float64): Sample returns each completion's routed experts (packed bytes), a GRPO step that
// carries them back replays them with no decision differing from the router's, and the
// load-balancing loss asked per request adds its metric.
import { strict as assert } from 'assert';
import { after, before, test } from 'node:test';
import { Client } from '@streambp/client';
import { missingServer, startServer, type Server } from './helpers';

const skip = missingServer(true) || false;
let server: Server;
let client: Client;

before(async () => {
  if (skip) return;
  server = await startServer('moe', ['--preset', 'tiny', '--family', 'qwen3_moe', '--dtype', 'float64']);
  client = new Client(server.target);
});

after(async () => {
  client?.close();
  await server?.stop();
});

test('sampled routing trains as it was sampled', { skip }, async () => {
  const prompt = [5, 6, 7, 8];
  const sampled = await client.sample({ prompts: [{ tokens: prompt }], n: 2, max_tokens: 5, seed: 2,
                                        return_routed_experts: true });
  for (const c of sampled.completions) {
    const r = c.routed_experts;
    assert.ok(r && r.bytes_per_id === 1 && r.experts_per_token === 2 && r.sparse_layers > 0);
    assert.equal(r.ids.length, (prompt.length + c.tokens.length) * r.sparse_layers * r.experts_per_token);
  }
  const batch = { grpo: { groups: [{ prompt, completions: sampled.completions.map((c, i) => ({
    tokens: c.tokens, logprobs: c.logprobs, reward: i, routed_experts: c.routed_experts })) }] } };
  const replayed = await client.forwardBackward({ batch });
  assert.equal(replayed.stats?.metrics.routing_mismatch, 0, JSON.stringify(replayed.stats?.metrics));
  const withAux = await client.forwardBackward({ batch, engine: { router_aux_loss_coef: 0.5 } });
  assert.ok((withAux.stats?.metrics.router_aux_loss ?? 0) > 0, JSON.stringify(withAux.stats?.metrics));
});
