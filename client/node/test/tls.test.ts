// TLS options against the real server: mutual TLS with certificates made here by openssl
// (a CA, a server certificate for localhost, a client certificate) and a bearer token.
import { strict as assert } from 'assert';
import { execFileSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';
import { after, before, test } from 'node:test';
import { Client, StreambpError } from '@streambp/client';
import { missingServer, startServer, tempDir, type Server } from './helpers';

const skip = missingServer() || false;
const TOKEN = 'node-test-token-0123456789abcdef';
let certs = '';
let server: Server;

function openssl(...args: string[]): void {
  execFileSync('openssl', args, { cwd: certs, stdio: 'ignore' });
}

before(async () => {
  if (skip) return;
  certs = tempDir('certs');
  openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'ca.key', '-out', 'ca.pem', '-days', '2',
          '-subj', '/CN=node-test-ca');
  fs.writeFileSync(path.join(certs, 'san.ext'), 'subjectAltName=DNS:localhost,IP:127.0.0.1\n');
  for (const [name, extra] of [['server', ['-extfile', 'san.ext']], ['client', []]] as const) {
    openssl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=${name}`);
    openssl('x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial',
            '-out', `${name}.pem`, '-days', '2', ...extra);
  }
  server = await startServer('tls', [], () => ({
    tls: { cert: path.join(certs, 'server.pem'), key: path.join(certs, 'server.key'), client_ca: path.join(certs, 'ca.pem') },
    auth: { tokens: [TOKEN] },
  }));
});

after(async () => {
  await server?.stop();
  if (certs) fs.rmSync(certs, { recursive: true, force: true });
});

function connect(options: ConstructorParameters<typeof Client>[1]): Client {
  const port = server.target.split(':')[1];
  return new Client(`localhost:${port}`, { retry: { maxAttempts: 1 }, infoDeadlineSeconds: 10, ...options });
}

test('mutual TLS with a bearer token; a wrong token or no client certificate is refused', { skip }, async () => {
  const tls = { rootCerts: path.join(certs, 'ca.pem'), certChain: path.join(certs, 'client.pem'),
                privateKey: fs.readFileSync(path.join(certs, 'client.key')) };
  const good = connect({ tls, token: TOKEN });
  assert.ok((await good.getInfo()).num_layers > 0);
  good.close();

  const wrongToken = connect({ tls, token: 'not-the-right-token-at-all' });
  await assert.rejects(wrongToken.getInfo(), (e: StreambpError) => e.codeName === 'UNAUTHENTICATED');
  wrongToken.close();

  const noCert = connect({ tls: { rootCerts: fs.readFileSync(path.join(certs, 'ca.pem'), 'utf8') }, token: TOKEN });
  await assert.rejects(noCert.getInfo(), (e: StreambpError) => e instanceof StreambpError && e.codeName === 'UNAVAILABLE');
  noCert.close();

  assert.throws(() => connect({ tls: { certChain: path.join(certs, 'client.pem') } }),
                (e: StreambpError) => e.codeName === 'INVALID_ARGUMENT');
});
