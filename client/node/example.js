#!/usr/bin/env node
// A Node client of streambp-server: GetInfo, one SFT TrainStep, ComputeLogprobs.
//   cd client/node && npm install && node example.js --server 127.0.0.1:50051 [--json]
// The protocol is loaded from proto/ at run time (@grpc/proto-loader), so nothing is generated.
'use strict';
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

function arg(name, fallback) {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}
const target = arg('--server', process.env.STREAMBP_SERVER || '127.0.0.1:50051');
const protoRoot = arg('--proto', path.join(__dirname, '..', '..', 'proto'));
const asJson = process.argv.includes('--json');

const definition = protoLoader.loadSync('streambp/v1/trainer.proto', {
  includeDirs: [protoRoot], keepCase: true, longs: Number, defaults: true, oneofs: true,
});
const { Trainer } = grpc.loadPackageDefinition(definition).streambp.v1;
const client = new Trainer(target, grpc.credentials.createInsecure(),
                           { 'grpc.max_receive_message_length': 64 << 20 });
const metadata = new grpc.Metadata();
if (process.env.STREAMBP_TOKEN) metadata.add('authorization', `Bearer ${process.env.STREAMBP_TOKEN}`);

function call(method, request, seconds = 600) {
  return new Promise((resolve, reject) => {
    const deadline = new Date(Date.now() + seconds * 1000);
    client[method](request, metadata, { deadline }, (err, resp) => (err ? reject(err) : resolve(resp)));
  });
}

async function main() {
  const info = await call('GetInfo', {}, 30);
  const examples = [
    { tokens: [1, 5, 9, 13, 17, 21, 25, 29, 33, 37], loss_mask: [0, 0, 1, 1, 1, 1, 1, 1, 1, 1] },
    { prompt: [2, 4, 6], completion: [8, 10, 12, 14] },
  ];
  const step = await call('TrainStep', { request_id: `node-${process.pid}-${Date.now()}`,
                                         batch: { sft: { examples } } });
  const logprobs = await call('ComputeLogprobs', { sequences: [{ tokens: [1, 2, 3, 4, 5] }] });
  const result = {
    architecture: info.architecture, vocab_size: info.vocab_size, dtype: info.dtype,
    loss: step.stats.loss, targets: step.stats.targets, policy_version: step.optim.policy_version,
    logprobs: logprobs.sequences[0].logprobs,
  };
  if (asJson) {
    console.log(JSON.stringify(result));
  } else {
    console.log(`${info.architecture} (${info.vocab_size} tokens, ${info.dtype}) at ${target}`);
    console.log(`TrainStep: loss ${step.stats.loss.toFixed(6)} over ${step.stats.targets} targets -> policy v${result.policy_version}`);
    console.log(`ComputeLogprobs [1..5]: ${result.logprobs.map((x) => x.toFixed(4)).join(' ')}`);
  }
  client.close();
}

main().catch((err) => {
  console.error(`error: ${err.code !== undefined ? grpc.status[err.code] : ''} ${err.details || err.message}`);
  process.exit(1);
});
