#!/usr/bin/env python3
"""The README's first steps, walked top to bottom as a new user would (issue 29): `bash
scripts/main.sh` serves the embedded model, then every ```sh block of "Five minutes with it"
runs in order, verbatim, in one shell session per block from the repository root (a block's
background server stays up for the lines after it). The numbers the text gives for these
commands must be what they print: the loss of the 20 SFT steps ("falls from A to B") and the
RL demo's reward ("from about 0.5 to 1.0").

    readme_test.py <repository> <build dir>

Ports 127.0.0.1:50051 and :50052 are the README's; a port already taken fails the test
saying so (stop your own server first).
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time

ROOT, BUILD = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
LOGS = os.path.join(BUILD, "readme_test")
os.makedirs(LOGS, exist_ok=True)


def fail(what):
    print("FAIL:", what, flush=True)
    sys.exit(1)


def port_free(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def section(text, title):
    start = text.index("## " + title)
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def localize(block):
    """The README says build/...: the test's build folder may be elsewhere."""
    rel = os.path.relpath(BUILD, ROOT)
    return block if rel == "build" else re.sub(r"(?<![\w/.-])build/", rel + "/", block)


def run_block(i, block, groups):
    log = os.path.join(LOGS, f"block{i}.log")
    script = "set -euo pipefail\n" + localize(block)
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", "-c", script], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        groups.append(proc.pid)
        rc = proc.wait(timeout=600)
    text = open(log).read()
    if rc != 0:
        fail(f"README block {i} exited {rc}:\n{block}\n--- its output (last 3000 characters):\n{text[-3000:]}")
    return text


def main() -> int:
    readme = open(os.path.join(ROOT, "README.md")).read()
    five = section(readme, "Five minutes with it")
    blocks = re.findall(r"```sh\n(.*?)```", five, re.S)
    if len(blocks) < 3:
        fail(f"expected the README's three command blocks in 'Five minutes with it', found {len(blocks)}")
    for port in (50051, 50052):
        if not port_free(port):
            fail(f"127.0.0.1:{port} is taken: the README's commands use it (stop the server listening there)")
    t0 = time.time()
    groups = []
    env = dict(os.environ, BUILD_DIR=BUILD)
    main_log = open(os.path.join(LOGS, "main.log"), "w")
    main_sh = subprocess.Popen(["bash", "scripts/main.sh"], cwd=ROOT, env=env, stdout=main_log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    groups.append(main_sh.pid)
    try:
        deadline = time.time() + 600
        while port_free(50051):
            if main_sh.poll() is not None:
                fail(f"scripts/main.sh exited {main_sh.returncode}: " + open(main_log.name).read()[-3000:])
            if time.time() > deadline:
                fail("scripts/main.sh did not serve on 127.0.0.1:50051 within 10 minutes")
            time.sleep(0.2)
        outputs = [run_block(i, b, groups) for i, b in enumerate(blocks)]

        # "the loss falls from 5.62 to 3.04 in the 20 steps"
        claim = re.search(r"the loss falls from ([0-9.]+) to ([0-9.]+) in the (\d+) steps", five)
        if claim is None:
            fail("the README no longer states the loss of its train example: update this test")
        m = re.search(r"summary: (\d+) steps .*first loss ([0-9.]+), last loss ([0-9.]+)", outputs[0])
        if m is None:
            fail("no summary line from `streambp train`:\n" + outputs[0][-2000:])
        steps, first, last = int(m.group(1)), float(m.group(2)), float(m.group(3))
        said = (int(claim.group(3)), claim.group(1), claim.group(2))
        if (steps, f"{first:.2f}", f"{last:.2f}") != said:
            fail(f"README says the loss falls from {said[1]} to {said[2]} in {said[0]} steps; "
                 f"the command gives {first:.6f} -> {last:.6f} in {steps}")
        # "goes from about 0.5 to 1.0"
        m = re.search(r"mean reward: first 5 versions ([0-9.]+) -> last 5 versions ([0-9.]+)", outputs[1])
        if m is None or not (0.35 <= float(m.group(1)) <= 0.65 and float(m.group(2)) >= 0.9):
            fail("the RL demo's reward does not go from about 0.5 to 1.0: " + (m.group(0) if m else outputs[1][-2000:]))
        if "history" in blocks[0] and not re.search(r"\n\s+20\s+20\s+train\s", outputs[0]):
            fail("`streambp history` did not list the 20 steps:\n" + outputs[0][-3000:])
    finally:
        for pid in groups:
            try:
                os.killpg(pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        try:
            main_sh.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(main_sh.pid, signal.SIGKILL)
    if main_sh.returncode not in (0, -signal.SIGINT, 130):
        fail(f"scripts/main.sh did not stop cleanly on Ctrl-C (exit {main_sh.returncode})")
    print(f"readme: scripts/main.sh and the {len(blocks)} command blocks of 'Five minutes with it' ran in order; "
          f"loss {first:.2f} -> {last:.2f} in {steps} steps as the README says ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
