#!/usr/bin/env python3
"""Losses as data through the Python SDK against a real server (float64, AdamW): Datum batches
(Tinker's shape: model input + named per-token tensors, from lists, numpy arrays and torch
tensors) for a loss named by objective, its config by name.

- cross_entropy: the step's loss is -sum w logp, with logp from compute_logprobs (fp64),
  <= 1e-10; a supervised loop of Tinker's shape (forward_backward on data + optim_step with
  AdamParams) drives the loss down.
- ppo with loss_fn_config (as a keyword and as the options dict): the loss is PPO written out
  here from fp64 log-probs; clip_fraction matches.
- GetInfo lists each objective's options and inputs.
- bad data: an unknown input, a short tensor, a float target, an unknown config key, a loss
  that takes no data: INVALID_ARGUMENT naming it, nothing trained.

    sdk_datum_test.py <streambp-server>
"""
import math
import sys
import time

from sdk_util import check, close, expect_error, start

import grpc

import streambp
from streambp import pb

ARGS = ("--dtype", "float64", "--optimizer", "adamw", "--lr", "0.001")
QUIET = {"log": {"level": "warn"}}
SEQS = [[5, 9, 13, 17, 21, 25, 29], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [100, 42, 7, 8]]


def datum(seq, **inputs):
    """A datum of a whole sequence: the model reads all but the last token; target_tokens are the rest."""
    return streambp.datum(seq[:-1], {"target_tokens": seq[1:], **inputs})


def main() -> int:
    t0 = time.time()
    (server,) = start(sys.argv[1], ("datum", QUIET, ARGS))
    with streambp.ServiceClient(server.target) as service:
        service.wait_ready(60)
        tc = service.training_client()

        info = tc.info()
        by_name = {o.name: o for o in info.objectives}
        check(by_name["ppo"].inputs == ["logprobs", "advantages"], f"ppo inputs: {by_name['ppo']}")
        check("clip_low_threshold" in by_name["ppo"].options, f"ppo options: {by_name['ppo']}")
        check(by_name["cross_entropy"].optional_inputs == ["weights"], f"cross_entropy: {by_name['cross_entropy']}")
        check(by_name["dpo"].inputs == [], "dpo takes no data batch")

        # cross_entropy: weights 0 on a "prompt" (the first two targets), 1 after; exact loss.
        weights = [[0.0 if t < 2 else 1.0 for t in range(len(s) - 1)] for s in SEQS]
        data = [datum(s, weights=w) for s, w in zip(SEQS, weights)]
        lp = tc.compute_logprobs(SEQS, fp64=True).logprobs
        expected = -sum(w * x for ws, xs in zip(weights, lp) for w, x in zip(ws, xs))
        out = tc.forward_backward(data, "cross_entropy")
        check(close(out.stats.loss, expected, 1e-10), f"cross_entropy loss {out.stats.loss} vs {expected}")
        check(out.stats.targets == sum(len(s) - 1 for s in SEQS), f"targets {out.stats.targets}")
        tc.optim_step()

        # A supervised loop as Tinker's cookbook writes it: forward_backward + optim_step(AdamParams).
        losses = []
        for _ in range(8):
            fb = tc.forward_backward_future(data, "cross_entropy")
            opt = tc.optim_step_future(adam_params=streambp.AdamParams(learning_rate=0.05))
            losses.append(fb.result().stats.loss)
            opt.result()
        check(losses[-1] < 0.7 * losses[0], f"the supervised loop learns: {losses[0]:.3f} -> {losses[-1]:.3f}")
        print(f"supervised loop (cross_entropy on data, AdamParams lr 0.05): loss {losses[0]:.3f} -> {losses[-1]:.3f}")

        # ppo with its clip thresholds by name; side inputs as numpy arrays and torch tensors when present.
        lp = tc.compute_logprobs(SEQS, fp64=True).logprobs
        lo, hi = 0.9, 1.15
        # (<= 0: after the loop some tokens are nearly certain)
        q = [[min(0.0, x - (-0.3 + 0.6 * ((5 * k + 3 * t) % 7) / 6.0)) for t, x in enumerate(xs)]
             for k, xs in enumerate(lp)]
        adv = [[-0.6 if (k + t) % 3 == 0 else 1.1 for t in range(len(xs))] for k, xs in enumerate(lp)]
        loss, clipped, tokens = 0.0, 0, 0
        for xs, qs, As in zip(lp, q, adv):
            for x, qq, a in zip(xs, qs, As):
                r = math.exp(x - qq)
                loss -= min(r * a, min(max(r, lo), hi) * a)
                clipped += r < lo or r > hi
                tokens += 1
        check(0 < clipped < tokens, f"some tokens clipped: {clipped} of {tokens}")
        forms = [("lists", lambda v: v)]
        try:
            import numpy  # noqa: F401
            forms.append(("numpy", lambda v: numpy.array(v, dtype=numpy.float64)))
        except ImportError:
            print("numpy not installed: the numpy form is not run")
        if streambp.torch_available():
            import torch
            forms.append(("torch", lambda v: torch.tensor(v, dtype=torch.float64)))
        for name, form in forms:
            data = [datum(s, logprobs=form(qs), advantages=form(As)) for s, qs, As in zip(SEQS, q, adv)]
            out = tc.forward_backward(data, "ppo", loss_fn_config={"clip_low_threshold": lo, "clip_high_threshold": hi})
            check(close(out.stats.loss, loss, 1e-10), f"ppo ({name}) loss {out.stats.loss} vs {loss}")
            check(close(out.stats.metrics["clip_fraction"], clipped / tokens, 1e-12),
                  f"ppo ({name}) clip_fraction {out.stats.metrics['clip_fraction']} vs {clipped / tokens}")
        # The options dict of a data batch is its loss_fn_config.
        out = tc.forward_backward(data, "ppo", {"clip_low_threshold": lo, "clip_high_threshold": hi})
        check(close(out.stats.loss, loss, 1e-10), f"ppo (options dict) loss {out.stats.loss} vs {loss}")
        tc.optim_step()

        # Bad data: refused naming it, nothing trained.
        before = tc.info()
        good = [datum(SEQS[0], logprobs=q[0], advantages=adv[0])]
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, tc.train_step,
                     [datum(SEQS[0], logprobs=q[0], advantages=adv[0], weights=weights[0])], "ppo",
                     contains="unknown input 'weights' for objective 'ppo'")
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, tc.train_step,
                     [datum(SEQS[0], logprobs=q[0][:-1], advantages=adv[0])], "ppo",
                     contains="loss_fn_inputs[logprobs] has 5 values but model_input has 6 tokens")
        bad_targets = streambp.datum(SEQS[0][:-1], {"target_tokens": streambp.tensor_data([float(x) for x in SEQS[0][1:]]),
                                                    "logprobs": q[0], "advantages": adv[0]})
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, tc.train_step, [bad_targets], "ppo",
                     contains="holds token ids: give them as int_data")
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, tc.train_step, good, "ppo",
                     loss_fn_config={"clip_lo": 0.9}, contains="clip_low_threshold")
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, tc.train_step, good, "dpo",
                     contains="objective 'dpo' takes no data batch")
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, tc.train_step, good, "",
                     contains="a data batch needs the loss function by name")
        after = tc.info()
        check(after.step == before.step and after.policy_version == before.policy_version,
              f"nothing trained: step {before.step} -> {after.step}")
        # The SDK's own checks name the field before anything is sent.
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, streambp.datum, [1, 2], {"target_tokens": [2, 3],
                                                                               "weights": [1.0, float("nan")]},
                     contains="loss_fn_inputs[weights][1]")
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, streambp.datum, [1, 2], {"target_tokens": [2.5, 3]},
                     contains="token ids must be whole numbers")
    print(f"OK ({time.time() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
