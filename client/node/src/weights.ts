import { createHash, type Hash } from 'crypto';
import * as fs from 'fs';
import * as path from 'path';
import * as grpc from '@grpc/grpc-js';
import { StreambpError } from './errors';
import type { WeightsChunk__Output } from './generated';

/** What exportWeightsToFolder wrote. */
export interface ExportedFolder {
  /** The folder. */
  dir: string;
  /** "model" (model.safetensors + config.json) or "peft_adapter" (adapter_model.safetensors + adapter_config.json). */
  format: string;
  /** Policy version of the weights. */
  policy_version: number;
  /** Bytes and SHA-256 (hex) of the weights file, verified. */
  total_bytes: number;
  sha256: string;
  /** Set when the version asked for was not the one served. */
  note: string;
  /** Names of every file written, the weights and their configuration first. */
  files: string[];
}

const WEIGHTS_NAME: Record<string, [string, string]> = {
  model: ['model.safetensors', 'config.json'],
  peft_adapter: ['adapter_model.safetensors', 'adapter_config.json'],
};

function dataLoss(message: string): StreambpError {
  return new StreambpError(grpc.status.DATA_LOSS, message, { method: 'ExportWeights' });
}

/** One file being received: written to a hidden partial file, verified, then renamed. */
class Incoming {
  private readonly hash: Hash = createHash('sha256');
  received = 0;
  done = false;
  constructor(readonly partial: string, private readonly fd: number) {}

  static open(dir: string, name: string): Incoming {
    const partial = path.join(dir, `.${name}.partial`);
    return new Incoming(partial, fs.openSync(partial, 'w'));
  }

  append(data: Buffer): void {
    fs.writeSync(this.fd, data);
    this.hash.update(data);
    this.received += data.length;
  }

  finish(sha256: string, what: string): void {
    fs.closeSync(this.fd);
    this.done = true;
    const got = this.hash.digest('hex');
    if (got !== sha256.toLowerCase()) throw dataLoss(`${what}: sha256 ${got}, the server sent ${sha256}`);
  }

  discard(): void {
    if (!this.done) fs.closeSync(this.fd);
    fs.rmSync(this.partial, { force: true });
  }
}

/**
 * Writes an ExportWeights stream into `dir`: the weights and their configuration, then the
 * side files of with_files. Every piece is checked (contiguous offsets, total size, SHA-256
 * of each file, file names without paths) and nothing is renamed into place until the whole
 * stream has been verified; an inconsistent stream is DATA_LOSS and leaves no partial file.
 */
export async function writeWeightsFolder(chunks: AsyncIterable<WeightsChunk__Output>, dir: string): Promise<ExportedFolder> {
  fs.mkdirSync(dir, { recursive: true });
  const weights = Incoming.open(dir, 'export.safetensors');
  const sides = new Map<string, Incoming>();
  const result: ExportedFolder = { dir, format: 'model', policy_version: 0, total_bytes: 0, sha256: '', note: '', files: [] };
  let config = '';
  let first = true;
  try {
    for await (const chunk of chunks) {
      const data = chunk.data ?? Buffer.alloc(0);
      if (chunk.file) {
        if (!weights.done) throw dataLoss(`file ${chunk.file} before the weights' last message`);
        if (!/^[A-Za-z0-9_][A-Za-z0-9._-]*$/.test(chunk.file)) throw dataLoss(`a file with a bad name: ${chunk.file}`);
        let file = sides.get(chunk.file);
        if (!file) sides.set(chunk.file, (file = Incoming.open(dir, chunk.file)));
        if (file.done || chunk.offset !== file.received) throw dataLoss(`file ${chunk.file}: pieces not contiguous`);
        file.append(data);
        if (chunk.last) file.finish(chunk.sha256, `file ${chunk.file}`);
        continue;
      }
      if (first) {
        first = false;
        result.total_bytes = chunk.total_bytes;
        result.policy_version = chunk.policy_version;
        result.note = chunk.note;
        if (chunk.format) result.format = chunk.format;
        if (!WEIGHTS_NAME[result.format]) throw dataLoss(`unknown format "${result.format}"`);
      }
      if (weights.done) throw dataLoss('weights after their last message');
      if (chunk.offset !== weights.received) {
        throw dataLoss(`offset ${chunk.offset}, expected ${weights.received} (chunks not contiguous)`);
      }
      if (weights.received + data.length > result.total_bytes) throw dataLoss(`data beyond total_bytes ${result.total_bytes}`);
      weights.append(data);
      if (chunk.last) {
        if (weights.received !== result.total_bytes) {
          throw dataLoss(`received ${weights.received} bytes, expected total_bytes ${result.total_bytes}`);
        }
        weights.finish(chunk.sha256, 'the weights');
        result.sha256 = chunk.sha256.toLowerCase();
        config = chunk.config_json;
      }
    }
    if (!weights.done) throw dataLoss('the stream ended without the weights\' last message');
    for (const [name, file] of sides) if (!file.done) throw dataLoss(`file ${name} ended without its last message`);
    if (!config) throw dataLoss('the server sent no configuration with the weights');
  } catch (error) {
    weights.discard();
    for (const file of sides.values()) file.discard();
    throw error;
  }
  const [weightsName, configName] = WEIGHTS_NAME[result.format];
  fs.renameSync(weights.partial, path.join(dir, weightsName));
  fs.writeFileSync(path.join(dir, configName), config);
  result.files.push(weightsName, configName);
  for (const [name, file] of sides) {
    fs.renameSync(file.partial, path.join(dir, name));
    result.files.push(name);
  }
  return result;
}
