#!/usr/bin/env node
// Copies the wire contract (proto/streambp/v1/*.proto of the repository) into the package's
// own proto/ folder, which the package ships and loads at run time (see src/proto.ts).
// Run by `npm run build` and before `npm pack` / `npm publish`.
'use strict';
const fs = require('fs');
const path = require('path');

const pkg = path.resolve(__dirname, '..');
const from = path.resolve(pkg, '..', '..', 'proto', 'streambp', 'v1');
const to = path.join(pkg, 'proto', 'streambp', 'v1');

if (!fs.existsSync(from)) {
  // An unpacked package (no repository around it) already carries its proto/.
  if (fs.existsSync(path.join(to, 'trainer.proto'))) process.exit(0);
  console.error(`copy-proto: neither ${from} nor ${to}/trainer.proto exists`);
  process.exit(1);
}
fs.rmSync(path.join(pkg, 'proto'), { recursive: true, force: true });
fs.mkdirSync(to, { recursive: true });
for (const name of fs.readdirSync(from).filter((n) => n.endsWith('.proto')).sort()) {
  fs.copyFileSync(path.join(from, name), path.join(to, name));
}
