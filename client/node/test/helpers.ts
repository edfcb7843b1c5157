// Shared by the tests: a real streambp-server on a loopback port, and safetensors reading.
// STREAMBP_SERVER_BIN names the server binary (the tests that need one skip without it);
// STREAMBP_TOKENIZER_DIR a folder with a real tokenizer.json (Qwen3) for the text RPCs.
import { spawn, spawnSync, type ChildProcess } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

export const serverBin = process.env.STREAMBP_SERVER_BIN ?? '';
export const tokenizerDir = process.env.STREAMBP_TOKENIZER_DIR ?? '';

/**
 * Why a server test cannot run here, or '' when it can. Under ctest (STREAMBP_REQUIRE_SERVER=1)
 * a missing server or tokenizer is an error, not a skip.
 */
export function missingServer(needTokenizer = false): string {
  const why = whyMissing(needTokenizer);
  if (why && process.env.STREAMBP_REQUIRE_SERVER === '1') throw new Error(why);
  return why;
}

function whyMissing(needTokenizer: boolean): string {
  if (!serverBin) return 'STREAMBP_SERVER_BIN is not set';
  if (!fs.existsSync(serverBin)) return `${serverBin} does not exist`;
  if (needTokenizer && !fs.existsSync(path.join(tokenizerDir, 'tokenizer.json'))) {
    return `no tokenizer.json in STREAMBP_TOKENIZER_DIR (${tokenizerDir || 'unset'})`;
  }
  return '';
}

export function tempDir(prefix: string): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), `streambp-node-${prefix}-`));
}

export interface Server {
  target: string;
  dir: string;
  stop(): Promise<void>;
}

/** `streambp-server serve` on 127.0.0.1:0 with these flags (and a config made in its folder, when given). */
export async function startServer(name: string, flags: string[], config?: (dir: string) => object): Promise<Server> {
  const dir = tempDir(name);
  const portFile = path.join(dir, 'port');
  const args = ['serve', '--listen', '127.0.0.1:0', '--port-file', portFile, ...flags];
  if (config) {
    fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config(dir)));
    args.push('--config', path.join(dir, 'config.json'));
  }
  const log = fs.openSync(path.join(dir, 'server.log'), 'w');
  const child: ChildProcess = spawn(serverBin, args, { stdio: ['ignore', log, log] });
  fs.closeSync(log);
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const started = Date.now();
  while (!(fs.existsSync(portFile) && fs.readFileSync(portFile, 'utf8').trim())) {
    if (child.exitCode !== null || Date.now() - started > 120_000) {
      child.kill('SIGKILL');
      throw new Error(`server ${name} did not start: ${fs.readFileSync(path.join(dir, 'server.log'), 'utf8').slice(-2000)}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    target: `127.0.0.1:${fs.readFileSync(portFile, 'utf8').trim()}`,
    dir,
    async stop() {
      if (child.exitCode === null) child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A tiny model folder around the real tokenizer (streambp-server init-model --tokenizer). */
export function modelWithTokenizer(dtype = 'float32'): string {
  const dir = path.join(tempDir('model'), 'model');
  const run = spawnSync(serverBin, ['init-model', '--out', dir, '--tokenizer', tokenizerDir, '--dtype', dtype],
                        { encoding: 'utf8' });
  if (run.status !== 0) throw new Error(`init-model failed: ${run.stdout}${run.stderr}`);
  return dir;
}

/** The float64 tensors of a safetensors file, by name. */
export function readSafetensors(file: string): Map<string, Float64Array> {
  const bytes = fs.readFileSync(file);
  const headerLength = Number(bytes.readBigUInt64LE(0));
  const header = JSON.parse(bytes.subarray(8, 8 + headerLength).toString('utf8')) as
    Record<string, { dtype: string; data_offsets: [number, number] }>;
  const tensors = new Map<string, Float64Array>();
  for (const [name, t] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const [begin, end] = t.data_offsets;
    const data = bytes.subarray(8 + headerLength + begin, 8 + headerLength + end);
    const copy = new Uint8Array(data);  // aligned
    if (t.dtype === 'F64') tensors.set(name, new Float64Array(copy.buffer));
    else if (t.dtype === 'F32') tensors.set(name, Float64Array.from(new Float32Array(copy.buffer)));
    else throw new Error(`${file}: tensor ${name} has dtype ${t.dtype}`);
  }
  return tensors;
}
