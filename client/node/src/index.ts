/**
 * @streambp/client: a typed Node client of streambp-server (the streambp.v1.Trainer service).
 *
 *   import { Client } from '@streambp/client';
 *   const client = new Client('127.0.0.1:50051', { token: process.env.STREAMBP_TOKEN });
 *   const info = await client.getInfo();
 *   const step = await client.trainStep({ batch: { sft: { examples: [{ tokens: [1, 2, 3, 4] }] } } });
 *
 * Every message type of the proto is exported as a type: X (what you send) and X__Output
 * (what the server returns: every field present, 64-bit integers as numbers).
 */
export { Client, METHODS, newRequestId } from './client';
export type { CallOptions, ClientOptions, CustomLossFn, CustomLossOptions, CustomLossOutput, CustomLossResult,
              StepCallOptions, TextInput, TlsOptions } from './client';
export { StreambpError } from './errors';
export { RolloutStream } from './rollouts';
export { DEFAULT_RETRY, isRetryable, retryPolicy, serviceConfig } from './retry';
export type { RetryPolicy } from './retry';
export type { ExportedFolder } from './weights';
export { LOADER_OPTIONS, PROTO_FILE, protoDir, protoPackage, trainerService } from './proto';
export * as tinker from './tinker';
export type * from './generated';
