import * as fs from 'fs';
import * as path from 'path';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import type { ProtoGrpcType } from './generated/trainer';
import type { TrainerDefinition } from './generated/streambp/v1/Trainer';

/**
 * How the proto is loaded at run time. The generated types (scripts/gen-types.js) are made
 * with the same choices: field names as in the proto (snake_case), 64-bit integers as
 * numbers, defaults for absent fields, and the name of the set member on each oneof.
 */
export const LOADER_OPTIONS: Readonly<protoLoader.Options> = Object.freeze({
  keepCase: true,
  longs: Number,
  defaults: true,
  oneofs: true,
});

export const PROTO_FILE = 'streambp/v1/trainer.proto';

/**
 * The folder holding streambp/v1/trainer.proto: the package's own proto/ (copied in by
 * `npm run build`), else the repository's proto/ when running from a checkout.
 */
export function protoDir(): string {
  const candidates = [path.join(__dirname, '..', 'proto'), path.join(__dirname, '..', '..', '..', 'proto')];
  const found = candidates.find((dir) => fs.existsSync(path.join(dir, PROTO_FILE)));
  if (!found) throw new Error(`${PROTO_FILE} not found in ${candidates.join(' or ')} (run npm run build)`);
  return found;
}

let loaded: ProtoGrpcType | undefined;

/** The streambp.v1 package as @grpc/grpc-js sees it (loaded once). */
export function protoPackage(): ProtoGrpcType {
  if (!loaded) {
    const definition = protoLoader.loadSync(PROTO_FILE, { ...LOADER_OPTIONS, includeDirs: [protoDir()] });
    loaded = grpc.loadPackageDefinition(definition) as unknown as ProtoGrpcType;
  }
  return loaded;
}

/** The Trainer service: one MethodDefinition (path, serializers) per RPC. */
export function trainerService(): TrainerDefinition {
  return protoPackage().streambp.v1.Trainer.service;
}
