#!/usr/bin/env python3
"""A rollout worker: Sample -> reward computed here -> PushRollouts, following WatchPolicy.

The toy task: the reward of a completion is the share of its tokens with an even id
(about 0.5 for a random model). Several workers can run at once against one server; the
server batches their groups into GRPO steps by itself.

    python3 client/python/examples/rollout_worker.py --server 127.0.0.1:50051 --versions 30

(with the streambp package installed, or run from the repository: it falls back to ../streambp)
"""
import argparse
import os
import random
import sys
import threading
from typing import Sequence

try:
    import streambp
except ImportError:  # run from the repository without installing the package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import streambp


def even_share(tokens: Sequence[int]) -> float:
    """The reward: the share of even token ids."""
    return sum(1 for t in tokens if t % 2 == 0) / max(1, len(tokens))


def odd_share(tokens: Sequence[int]) -> float:
    """The other experiment's reward: the share of odd token ids."""
    return 1.0 - even_share(tokens)


REWARDS = {"even": even_share, "odd": odd_share}


def main() -> int:
    ap = argparse.ArgumentParser(description="A rollout worker: Sample -> reward -> PushRollouts.")
    ap.add_argument("--server", default="127.0.0.1:50051")
    ap.add_argument("--token", default=None)
    ap.add_argument("--session", default="", help="the session to train (default: the whole model)")
    ap.add_argument("--versions", type=int, default=30, help="stop once the policy reaches this version")
    ap.add_argument("--n", type=int, default=8, help="completions per prompt (the GRPO group size)")
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--prompts", type=int, default=2, help="prompts (groups) per Sample call")
    ap.add_argument("--worker", type=int, default=0, help="worker id (seeds its prompts and samples)")
    ap.add_argument("--reward", choices=sorted(REWARDS), default="even",
                    help="even: the share of even token ids; odd: the share of odd ones")
    ap.add_argument("--quiet", action="store_true", help="do not print the policy versions")
    args = ap.parse_args()

    with streambp.ServiceClient(args.server, token=args.token) as service:
        try:
            service.wait_ready(timeout=60)
        except streambp.StreambpError as e:
            print(f"worker {args.worker}: {e.message}", file=sys.stderr)
            return 2
        tc = service.training_client(args.session)
        vocab = tc.info().vocab_size
        rng = random.Random(1000 + args.worker)
        done = threading.Event()

        def watch() -> None:
            with tc.watch_policy(since_version=0) as updates:
                for update in updates:
                    if update.source == "rollouts" and not args.quiet:
                        print(f"policy v{update.policy_version}: mean reward {update.reward_mean:.3f}  "
                              f"loss {update.loss:+.4f}  kl {update.kl:.4f}  clip {update.clip_fraction:.3f}  "
                              f"groups {update.groups_consumed}  dropped {update.groups_dropped}", flush=True)
                    if update.policy_version >= args.versions:
                        break
            done.set()

        threading.Thread(target=watch, daemon=True).start()
        pushed = 0
        while not done.is_set():
            prompts = [[rng.randrange(vocab) for _ in range(4)] for _ in range(args.prompts)]
            out = tc.sample(prompts, n=args.n, max_tokens=args.max_tokens, seed=rng.randrange(1 << 62))
            reward = REWARDS[args.reward]
            groups = [streambp.rollout_group(prompt, out.for_prompt(i), [reward(c.tokens) for c in out.for_prompt(i)],
                                             out.policy_version)
                      for i, prompt in enumerate(prompts)]
            for ack in tc.push_rollouts(groups):
                if ack.status not in ("accepted", "stale"):
                    print(f"worker {args.worker}: group {ack.group_id} {ack.status}: {ack.message}", file=sys.stderr)
            pushed += len(groups)
    print(f"worker {args.worker}: pushed {pushed} groups; the policy reached version {args.versions}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
