#!/usr/bin/env python3
"""Custom losses are exact: a loss written by hand in the client and run through
forward_backward_custom (ComputeLogprobs fp64 -> loss and dL/dlogp here -> a weighted_logprobs
ForwardBackward) moves the weights exactly as the server's built-in objective does, on two
identical float64 servers with SGD (lr 0.5): SFT (token cross-entropy, mean over targets)
and DPO (sigmoid loss with given reference log-probs), each compared as the update of every
weight, <= 1e-10 relative. Weights computed at an old policy version are refused with
FAILED_PRECONDITION and change nothing. The same SFT loss written with torch (autograd on the
client, mode "auto") too: CI installs Debian's python3-torch; elsewhere it is skipped without it.

    sdk_custom_loss_test.py <streambp-server>
"""
import math
import os
import sys
import time

from sdk_util import TMP, check, close, start

import grpc

import streambp

ARGS = ["--dtype", "float64", "--optimizer", "sgd", "--lr", "0.5"]
QUIET = {"log": {"level": "warn"}}
TOL = 1e-10

SFT = [[5, 9, 13, 17, 21, 25, 29], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [100, 42, 7]]
# DPO pairs: prompt, chosen, rejected, and reference log-probs of the completions.
BETA = 0.1
PAIRS = [([1, 2, 3], [4, 5], [6, 7, 8], -7.5, -9.25), ([10, 11], [12, 13, 14], [15], -8.0, -3.5)]


def sft_loss(sequences, logprobs):
    """Mean token cross-entropy over every target (what the built-in sft computes), with its gradient."""
    n = sum(len(lp) for lp in logprobs)
    loss = -sum(map(sum, logprobs)) / n
    return loss, [[-1.0 / n] * len(lp) for lp in logprobs], {"targets": n}


def dpo_loss(sequences, logprobs):
    """Sigmoid DPO over pairs (sequences 2k = prompt+chosen, 2k+1 = prompt+rejected), mean over pairs."""
    grads = [[0.0] * len(lp) for lp in logprobs]
    loss = 0.0
    for k, (prompt, chosen, rejected, ref_c, ref_r) in enumerate(PAIRS):
        first = len(prompt) - 1  # logprobs[i] predicts token i+1: the completion starts at len(prompt)
        c = sum(logprobs[2 * k][first:])
        r = sum(logprobs[2 * k + 1][first:])
        h = BETA * ((c - r) - (ref_c - ref_r))
        loss += math.log1p(math.exp(-h)) / len(PAIRS)  # -log sigmoid(h)
        d = -BETA / (1 + math.exp(h)) / len(PAIRS)  # dL/dc = -beta sigmoid(-h) / pairs; dL/dr = -dL/dc
        for i in range(first, len(logprobs[2 * k])):
            grads[2 * k][i] = d
        for i in range(first, len(logprobs[2 * k + 1])):
            grads[2 * k + 1][i] = -d
    return loss, grads


def export(tc, name):
    folder = os.path.join(TMP, name)
    tc.save_weights(folder, with_files=False)
    return streambp.load_safetensors(os.path.join(folder, "model.safetensors"))


def same_update(before_a, after_a, before_b, after_b, what):
    """The updates (after - before) of the two servers agree to TOL relative to the largest."""
    largest, worst = 0.0, 0.0
    for name in before_a:
        for w0a, w1a, w0b, w1b in zip(before_a[name].values, after_a[name].values, before_b[name].values,
                                      after_b[name].values):
            ua, ub = w1a - w0a, w1b - w0b
            largest = max(largest, abs(ua))
            worst = max(worst, abs(ua - ub))
    check(largest > 0, f"{what}: the step changed no weight")
    check(worst <= TOL * largest, f"{what}: updates differ by {worst:.3g} (largest update {largest:.3g})")
    print(f"{what}: largest update {largest:.3g}, largest difference {worst:.3g} "
          f"({worst / largest:.2g} relative)", flush=True)


def same_weights(a, b, what):
    """The two servers' weights agree to TOL relative to the largest weight."""
    largest, worst = 0.0, 0.0
    for name in a:
        for x, y in zip(a[name].values, b[name].values):
            largest = max(largest, abs(x))
            worst = max(worst, abs(x - y))
    check(worst <= TOL * largest, f"{what}: the servers' weights differ by {worst:.3g} (largest {largest:.3g})")


def main() -> int:
    server_bin = sys.argv[1]
    t0 = time.time()
    built_in_server, custom_server = start(server_bin, ("built-in", QUIET, ARGS), ("custom", QUIET, ARGS))
    built_in = streambp.ServiceClient(built_in_server.target).training_client()
    custom = streambp.ServiceClient(custom_server.target).training_client()
    w0a, w0b = export(built_in, "a0"), export(custom, "b0")

    # SFT.
    step = built_in.train_step(streambp.sft_batch(SFT))
    result = custom.forward_backward_custom(SFT, sft_loss, mode="gradients")
    custom.optim_step()
    check(close(result.loss, step.loss, TOL), f"sft loss: custom {result.loss!r}, built-in {step.loss!r}")
    check(result.metrics["targets"] == step.stats.targets, "sft targets")
    check("weight_abs_sum" in result.forward_backward.stats.metrics, "the server ran weighted_logprobs")
    w1a, w1b = export(built_in, "a1"), export(custom, "b1")
    same_update(w0a, w1a, w0b, w1b, "sft")

    # DPO (a loss that is not linear in the log-probs: the chain rule goes through the client).
    pairs = [{"prompt": p, "chosen": c, "rejected": r, "ref_chosen_logp": rc, "ref_rejected_logp": rr}
             for p, c, r, rc, rr in PAIRS]
    step = built_in.train_step(streambp.dpo_batch(pairs), options={"beta": BETA})
    sequences = [s for p, c, r, _, _ in PAIRS for s in (p + c, p + r)]
    result = custom.forward_backward_custom(sequences, dpo_loss, mode="gradients")
    custom.optim_step()
    check(close(result.loss, step.loss, TOL), f"dpo loss: custom {result.loss!r}, built-in {step.loss!r}")
    w2a, w2b = export(built_in, "a2"), export(custom, "b2")
    same_update(w1a, w2a, w1b, w2b, "dpo")

    # Weights computed at an old policy version are refused, and change nothing.
    old = custom.compute_logprobs(SFT, fp64=True)
    _, grads, _ = sft_loss(SFT, old.logprobs)
    custom.train_step(streambp.sft_batch(SFT[:1]))  # the policy moves on
    built_in.train_step(streambp.sft_batch(SFT[:1]))  # and the other server's with it: same weights again
    version = custom.info().policy_version
    try:
        custom.forward_backward(streambp.weighted_batch(SFT, grads, policy_version=old.policy_version))
        check(False, "weights of an old policy version were accepted")
    except streambp.StreambpError as e:
        check(e.code == grpc.StatusCode.FAILED_PRECONDITION, f"stale weights: {e.code.name}: {e.message}")
        check(str(old.policy_version) in e.message, f"the message names the version: {e.message}")
        print(f"stale weights refused: {e.code.name}: {e.message}", flush=True)
    info = custom.info()
    check(info.policy_version == version and info.pending_micro_batches == 0, "the refused call changed nothing")

    # The torch form (what mode "auto" picks whenever torch imports), from the same weights on
    # both servers: the earlier updates agreed and both took the same extra step.
    w3a, w3b = export(built_in, "a3"), export(custom, "b3")
    same_weights(w3a, w3b, "before the torch step")
    if streambp.torch_available():
        import torch  # pyright: ignore[reportMissingImports]

        def torch_sft(sequences, logprobs):
            return -torch.cat(logprobs).mean()
        built_in.train_step(streambp.sft_batch(SFT))
        result = custom.forward_backward_custom(SFT, torch_sft)  # mode "auto": torch
        custom.optim_step()
        check("weight_abs_sum" in result.forward_backward.stats.metrics, "the server ran weighted_logprobs")
        same_update(w3a, export(built_in, "a4"), w3b, export(custom, "b4"), "sft written with torch")
    elif os.environ.get("CI"):
        check(False, "torch is not importable: CI installs python3-torch (scripts/packages.txt) so that the torch "
              "form of the custom loss is tested")
    else:
        print("torch is not installed: the torch form of the custom loss is not tested here", flush=True)

    built_in.service.close()
    custom.service.close()
    print(f"sdk custom loss test: passed ({time.time() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
