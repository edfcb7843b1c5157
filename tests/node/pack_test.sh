#!/usr/bin/env bash
# The package as a user installs it: `npm pack` (of what setup.sh built: no prepack here, so
# tests running beside this one see dist/ unchanged), then `npm install` of the tarball into an
# empty project (dependencies from npm's cache, filled by setup.sh's npm ci); it loads its own
# proto/ from inside node_modules, and a TypeScript file using its types type-checks.
# Run by tests/node/run.sh in the package built by tests/node/setup.sh.
set -uo pipefail
pkg="$PWD"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
tgz="$(npm pack --silent --ignore-scripts --pack-destination "$dir" 2>/dev/null | tail -1)" || fail "npm pack"
[ -f "$dir/$tgz" ] || fail "npm pack wrote no tarball ($tgz)"
mkdir "$dir/app" && cd "$dir/app" && echo '{"name": "app", "private": true}' > package.json
timeout 300 npm install --prefer-offline --no-audit --no-fund --loglevel=error "$dir/$tgz" \
  "$pkg/node_modules/typescript" "$pkg/node_modules/@types/node" > npm.log 2>&1 || fail "npm install: $(tail -5 npm.log)"
node -e "
const { Client, protoDir } = require('@streambp/client');
const dir = protoDir();
if (!dir.startsWith(require('path').join(process.cwd(), 'node_modules', '@streambp', 'client'))) throw new Error('proto from ' + dir);
new Client('127.0.0.1:1').close();
console.log('loads its proto from ' + dir);
" || fail "the installed package does not load"
cat > app.ts <<'TS'
import { Client, type TrainStepResponse__Output } from '@streambp/client';
const client = new Client('127.0.0.1:1', { session: 'x' });
const step: Promise<TrainStepResponse__Output> = client.trainStep({ batch: { sft: { examples: [{ tokens: [1, 2] }] } } });
void step.catch(() => client.close());
TS
node node_modules/typescript/bin/tsc --noEmit --strict --module node16 --moduleResolution node16 --types node app.ts \
  || fail "tsc on a file using the installed package"
echo "pack test: passed ($(du -k "$dir/$tgz" | cut -f1) KiB tarball)"
