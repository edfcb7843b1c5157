#!/usr/bin/env python3
"""The Python SDK as a user installs it: a fresh venv (with Debian's site packages: grpcio,
protobuf, setuptools), `pip install --no-build-isolation --no-index` of a copy of
client/python (offline), then `python -c "import streambp; ..."` from that venv, outside
the source tree, against a real server. The old `import streambp_client` still works.

    sdk_install_test.py <streambp-server> [PYTHON3]
"""
import os
import shutil
import subprocess
import sys
import time

from sdk_util import PACKAGE_DIR, TMP, check, start

SCRIPT = r"""
import os, sys, streambp, streambp_client
assert os.path.realpath(streambp.__file__).startswith(os.path.realpath(sys.prefix)), streambp.__file__
with streambp.ServiceClient(sys.argv[1]) as service:
    info = service.info()
    tc = service.training_client()
    step = tc.train_step(streambp.sft_batch([[1, 5, 9, 13, 17, 21]]))
    out = tc.sample([[1, 2, 3]], n=2, max_tokens=3, seed=0)
    try:
        tc.train_step([[1, info.vocab_size]])
        raise SystemExit("a token outside the vocabulary was accepted")
    except streambp.StreambpError as e:
        assert e.code.name == "INVALID_ARGUMENT", e
with streambp_client.Client(sys.argv[1]) as old:  # the deprecated name still works
    assert old.info().vocab_size == info.vocab_size and len(old.compute_logprobs([[1, 2, 3]])[0]) == 2
print(f"installed streambp {streambp.__version__} from {os.path.dirname(streambp.__file__)}: "
      f"{info.architecture}, loss {step.loss:.4f}, policy v{step.policy_version}, {len(out.completions)} samples")
"""


def run(cmd, **kwargs):
    t = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    check(r.returncode == 0, f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r, time.time() - t


def main() -> int:
    server_bin = sys.argv[1]
    python = sys.argv[2] if len(sys.argv) > 2 else "/usr/bin/python3"
    t0 = time.time()
    (server,) = [s for s in start(server_bin, ("install", {"log": {"level": "warn"}}, ()))]

    source = os.path.join(TMP, "src")  # a copy: building in place would write build/ into the checkout
    shutil.copytree(PACKAGE_DIR, source, ignore=shutil.ignore_patterns("build", "*.egg-info", ".venv", "typecheck",
                                                                        "__pycache__"))
    venv = os.path.join(TMP, "venv")
    _, t_venv = run([python, "-m", "venv", "--system-site-packages", venv])
    pip = [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "--no-build-isolation", "--no-index",
           "--disable-pip-version-check", "--no-cache-dir", source]
    _, t_pip = run(pip)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r, t_run = run([os.path.join(venv, "bin", "python"), "-c", SCRIPT, server.target], cwd=TMP, env=env)
    print(r.stdout.strip(), flush=True)
    print(f"sdk install test: passed ({time.time() - t0:.1f} s: venv {t_venv:.1f} s, pip install {t_pip:.1f} s, "
          f"first calls {t_run:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
