#!/usr/bin/env python3
"""The RL demo: streambp-server on the embedded tiny model + 2 Python rollout workers.

Reward = share of even token ids in a completion (about 0.5 at random init). The server
runs a GRPO step whenever 4 groups are queued; the mean reward per policy version rises.

    python3 client/python/examples/rl_demo.py --server-bin build/server/streambp-server \
        [--versions 40] [--check 0.8]

With --experiments 2 the server hosts sessions and runs two experiments at once on its one
base model: two LoRA adapters, one rewarded for even token ids and one for odd ones, each
with its own rollout workers; both learn, in opposite directions.

(with the streambp package installed, or run from the repository: it falls back to ../streambp)
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import List

try:
    import streambp
except ImportError:  # run from the repository without installing the package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import streambp

HERE = os.path.dirname(os.path.abspath(__file__))
# The experiments' adapters: every projection, and the (untied) lm_head, whose adapter shifts
# the logits the reward is about directly.
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


class DemoError(Exception):
    """A failure the demo explains in one line (no traceback)."""


def start_server(server_bin: str, tmp: str, lr: float, sessions: bool) -> "tuple[subprocess.Popen, str]":
    """Starts streambp-server on a free loopback port; returns it and its address."""
    if not (os.path.isfile(server_bin) and os.access(server_bin, os.X_OK)):
        raise DemoError(f"no streambp-server at {server_bin}: build it (bash scripts/main.sh, or cmake --build "
                        "build) and pass its path with --server-bin")
    config = {
        "model": {"preset": "tiny", "seed": 0, "dtype": "float32"},
        "trainer": {"optimizer": {"name": "adamw", "lr": lr}, "max_grad_norm": 1.0,
                    "reference": {"use_reference_model": False}},
        "rollouts": {"groups_per_step": 4, "max_staleness": 2, "log": os.path.join(tmp, "rollouts.jsonl"),
                     "grpo": {"loss_type": "dapo", "scale_rewards": "group"}},
        "log": {"level": "warn"},
    }
    if sessions:  # each experiment a LoRA adapter on the frozen base, with its own rollout queue
        config["sessions"] = {"enabled": True, "state_dir": os.path.join(tmp, "sessions")}
        config["rollouts"]["log"] = ""
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f)
    port_file = os.path.join(tmp, "port")
    server = subprocess.Popen([server_bin, "serve", "--config", os.path.join(tmp, "config.json"),
                               "--listen", "127.0.0.1:0", "--port-file", port_file])
    for _ in range(1200):  # up to 2 minutes on a loaded machine
        if os.path.exists(port_file) and open(port_file).read().strip():
            return server, "127.0.0.1:" + open(port_file).read().strip()
        if server.poll() is not None:
            raise DemoError(f"the server exited with status {server.returncode} before listening (its log is above)")
        time.sleep(0.1)
    server.kill()
    raise DemoError("the server did not start listening within 2 minutes")


def watch(service: "streambp.ServiceClient", session: str, label: str, versions: int, start: float,
          rewards: List[float]) -> None:
    """Follows one session's policy versions until `versions`, printing each, into `rewards`."""
    tc = service.training_client(session)
    with tc.watch_policy(since_version=0, timeout=900) as updates:
        for update in updates:
            if update.source != "rollouts":
                continue
            rewards.append(update.reward_mean)
            print(f"{label}policy v{update.policy_version:3d}  mean reward {update.reward_mean:.3f}  "
                  f"loss {update.loss:+.4f}  clip {update.clip_fraction:.3f}  "
                  f"groups {update.groups_consumed} (+{update.groups_dropped} stale dropped)  "
                  f"{time.time() - start:6.1f}s", flush=True)
            if update.policy_version >= versions:
                break


def run_experiments(args: argparse.Namespace) -> int:
    """Two experiments on one server: sessions `even` and `odd`, each with its workers."""
    tmp = tempfile.mkdtemp(prefix="streambp-rl-demo-")
    try:
        server, target = start_server(args.server_bin, tmp, args.lr, sessions=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    workers: List[subprocess.Popen] = []
    try:
        experiments = ["even", "odd"][:args.experiments]
        with streambp.ServiceClient(target) as service:
            for i, name in enumerate(experiments):
                service.create_session(name, lora={"r": 8, "alpha": 16, "seed": i, "target_modules": TARGETS},
                                       training={"optimizer": {"name": "adamw", "lr": args.lora_lr}})
            print(f"server on {target}; {len(experiments)} experiments (LoRA r=8 sessions: "
                  f"{', '.join(experiments)}), {args.workers} rollout workers each", flush=True)
            for name in experiments:
                for w in range(args.workers):
                    workers.append(subprocess.Popen(
                        [sys.executable, os.path.join(HERE, "rollout_worker.py"), "--server", target,
                         "--session", name, "--reward", name, "--versions", str(args.versions),
                         "--worker", str(w + 10 * experiments.index(name)), "--quiet"], env=dict(os.environ)))
            start = time.time()
            rewards = {name: [] for name in experiments}
            threads = [threading.Thread(target=watch, args=(service, name, f"[{name:4s}] ", args.versions, start,
                                                            rewards[name]), daemon=True) for name in experiments]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=900)
        failed = False
        for name in experiments:
            r = rewards[name]
            first = sum(r[:5]) / max(1, len(r[:5]))
            last = sum(r[-5:]) / max(1, len(r[-5:]))
            print(f"[{name}] mean reward ({name} token ids): first 5 versions {first:.3f} -> last 5 versions "
                  f"{last:.3f}", flush=True)
            if args.check and last < args.check:
                print(f"FAIL: experiment {name}: the mean reward {last:.3f} did not reach {args.check}", flush=True)
                failed = True
        for w in workers:
            w.wait(timeout=120)
        return 1 if failed else 0
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        server.terminate()
        server.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    if args.experiments > 1:
        return run_experiments(args)
    tmp = tempfile.mkdtemp(prefix="streambp-rl-demo-")
    try:
        server, target = start_server(args.server_bin, tmp, args.lr, sessions=False)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    workers: List[subprocess.Popen] = []
    try:
        print(f"server on {target}; {args.workers} rollout workers; reward = share of even token ids", flush=True)
        for w in range(args.workers):
            workers.append(subprocess.Popen([sys.executable, os.path.join(HERE, "rollout_worker.py"),
                                             "--server", target, "--versions", str(args.versions),
                                             "--worker", str(w), "--quiet"], env=dict(os.environ)))
        rewards: List[float] = []
        start = time.time()
        with streambp.ServiceClient(target) as service:
            tc = service.training_client()
            with tc.watch_policy(since_version=0, timeout=900) as updates:
                for update in updates:
                    if update.source != "rollouts":
                        continue
                    rewards.append(update.reward_mean)
                    print(f"policy v{update.policy_version:3d}  mean reward {update.reward_mean:.3f}  "
                          f"loss {update.loss:+.4f}  clip {update.clip_fraction:.3f}  "
                          f"groups {update.groups_consumed} (+{update.groups_dropped} stale dropped)  "
                          f"{time.time() - start:6.1f}s", flush=True)
                    if update.policy_version >= args.versions:
                        break
            stats = tc.rollout_stats()
        first = sum(rewards[:5]) / max(1, len(rewards[:5]))
        last = sum(rewards[-5:]) / max(1, len(rewards[-5:]))
        print(f"mean reward: first 5 versions {first:.3f} -> last 5 versions {last:.3f}; "
              f"{stats.consumed} groups trained in {stats.steps_run} steps, {stats.dropped_stale} stale dropped",
              flush=True)
        for w in workers:
            w.wait(timeout=120)
        if args.check and last < args.check:
            print(f"FAIL: the mean reward {last:.3f} did not reach {args.check}", flush=True)
            return 1
        return 0
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        server.terminate()
        server.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description="The RL demo: streambp-server + Python rollout workers (GRPO).")
    ap.add_argument("--server-bin", required=True, help="path to streambp-server")
    ap.add_argument("--versions", type=int, default=40, help="policy versions to train")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--experiments", type=int, choices=[1, 2], default=1,
                    help="2: two sessions on one server, rewarded for even and for odd token ids")
    ap.add_argument("--lora-lr", type=float, default=0.05, help="learning rate of the experiments' adapters")
    ap.add_argument("--check", type=float, default=0.0,
                    help="exit 1 unless the mean reward of the last 5 versions reaches this")
    args = ap.parse_args()
    try:
        return run(args)
    except (DemoError, streambp.StreambpError) as e:
        print(f"rl_demo: {e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
