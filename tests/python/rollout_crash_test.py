#!/usr/bin/env python3
"""Crash safety of acknowledged rollouts: kill -9 the server after the acks and before the
step; a restart with the same rollout log trains the acknowledged groups, exactly once.

    rollout_crash_test.py <streambp-server>    (PYTHONPATH=client/python, or the streambp package installed)
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import streambp


def start(server_bin, config_path, tmp, name):
    port_file = os.path.join(tmp, name + ".port")
    log = open(os.path.join(tmp, name + ".log"), "w")
    proc = subprocess.Popen([server_bin, "serve", "--config", config_path, "--listen", "127.0.0.1:0",
                             "--port-file", port_file], stdout=log, stderr=log)
    for _ in range(1200):  # up to 2 minutes on a loaded machine
        if os.path.exists(port_file) and open(port_file).read().strip():
            return proc, streambp.ServiceClient("127.0.0.1:" + open(port_file).read().strip()).training_client()
        if proc.poll() is not None:
            raise SystemExit(f"server {name} exited: " + open(os.path.join(tmp, name + ".log")).read())
        time.sleep(0.1)
    raise SystemExit("server did not start")


def check(cond, what):
    if not cond:
        print("FAIL:", what, flush=True)
        sys.exit(1)


def main() -> int:
    server_bin = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="streambp-crash-")
    config = {"model": {"dtype": "float32"}, "log": {"level": "warn"},
              "rollouts": {"groups_per_step": 3, "log": os.path.join(tmp, "rollouts.jsonl")}}
    config_path = os.path.join(tmp, "config.json")
    json.dump(config, open(config_path, "w"))

    proc, client = start(server_bin, config_path, tmp, "first")
    prompts = [[1, 2, 3], [4, 5, 6]]
    out = client.sample(prompts, n=4, max_tokens=6, seed=3)
    groups = []
    for i, p in enumerate(prompts + [[7, 8, 9]]):
        comps = [c for c in out.completions if c.prompt_index == i % 2]
        groups.append(streambp.rollout_group(p, comps, [float(sum(t % 2 == 0 for t in c.tokens)) for c in comps],
                                             out.policy_version, group_id=f"group-{i}"))
    acks = client.push_rollouts(groups[:2])
    check([a.status for a in acks] == ["accepted", "accepted"], f"first acks: {acks}")
    check(client.rollout_stats().steps_run == 0, "no step before groups_per_step groups")
    proc.send_signal(signal.SIGKILL)  # after the acks, before any step
    proc.wait()

    proc, client = start(server_bin, config_path, tmp, "second")
    stats = client.rollout_stats()
    check(stats.queue_depth == 2 and stats.accepted == 2, f"the acknowledged groups were not replayed: {stats}")
    acks = client.push_rollouts(groups[:1])
    check(acks[0].status == "duplicate", f"a replayed group id pushed again must be a duplicate: {acks[0]}")
    acks = client.push_rollouts(groups[2:])
    check(acks[0].status == "accepted", f"third ack: {acks[0]}")
    for _ in range(1200):  # up to 60 s on a loaded machine
        stats = client.rollout_stats()
        # The step's counters can be published a moment before its policy version.
        if stats.steps_run == 1 and stats.policy_version == 1:
            break
        time.sleep(0.05)
    check(stats.steps_run == 1 and stats.consumed == 3 and stats.queue_depth == 0,
          f"the three groups were not trained exactly once: {stats}")
    check(client.info().policy_version == 1, "one step, one new version")
    proc.terminate()
    check(proc.wait(timeout=60) == 0, "clean shutdown")
    print("rollout crash test: passed (2 acknowledged groups survived kill -9 and were trained once)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
