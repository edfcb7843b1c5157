#!/usr/bin/env python3
"""Tinker's client surface (streambp.tinker) against a real server with sessions, with
Tinker-shaped calls only, as the Tinker cookbook writes its loops:

- supervised: Datum(ModelInput.from_ints, {"target_tokens", "weights"}) -> forward_backward
  (futures) -> optim_step(AdamParams); loss:sum falls; forward() gives per-datum log-probs
  and loss:sum = -sum w logp of the same data.
- RL: save_weights_and_get_sampling_client -> sample(prompt, num_samples, SamplingParams) ->
  reward (share of even token ids) -> advantages (reward - group mean) -> importance_sampling
  datums with the sampler's log-probs -> forward_backward + optim_step; the mean reward rises.
- distillation: a snapshot's top-k prompt log-probs as 2-D cross_entropy targets; the loss is
  the sum over the candidates and loss_fn_outputs are the candidates' log-probs, [N, K].
- a sampler snapshot samples the same tokens and log-probs (fixed seed) before and after its
  training session trains on, and its compute_logprobs stays the same.

    sdk_tinker_test.py <streambp-server>
"""
import math
import os
import sys
import time

from sdk_util import TMP, check, close, start

from streambp import tinker
from streambp.tinker import types

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


def supervised(training):
    """Teach fixed continuations; loss:sum (weights on the completion only) falls."""
    examples = [([3, 7, 11], [20, 22, 24, 26]), ([5, 9], [30, 31, 32]), ([40, 41, 42, 43], [50, 52])]
    data = []
    for prompt, completion in examples:
        tokens = prompt + completion
        weights = [0.0] * (len(prompt) - 1) + [1.0] * len(completion)
        data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                                loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights}))
    before = training.forward(data, "cross_entropy").result()
    losses, outputs = [], []
    for _ in range(12):
        fb = training.forward_backward(data, "cross_entropy")
        opt = training.optim_step(types.AdamParams(learning_rate=0.02))
        losses.append(fb.result().metrics["loss:sum"])
        outputs.append(fb.result().loss_fn_outputs)
        opt.result()
    # forward_backward's per-datum log-probs (Tinker's loss_fn_outputs) are forward's, at the
    # same weights, and give its loss: loss:sum = -sum weights * logprobs.
    first = [o["logprobs"].data for o in outputs[0]]
    check(all(close(a, b, 1e-12) for f, g in zip(first, [o["logprobs"].data for o in before.loss_fn_outputs])
              for a, b in zip(f, g)) and [len(f) for f in first] == [6, 4, 5],
          f"loss_fn_outputs = forward's log-probs: {first}")
    check(close(losses[0], -sum(w * x for d, lp in zip(data, first)
                                for w, x in zip(d.loss_fn_inputs["weights"], lp)), 1e-10),
          "loss:sum = -sum weights * loss_fn_outputs logprobs")
    check([o["logprobs"].data for o in outputs[1]] != first, "the next step's log-probs are at the new weights")
    check(close(losses[0], before.metrics["loss:sum"], 1e-10),
          f"forward's loss:sum {before.metrics['loss:sum']} = the first step's {losses[0]}")
    check(len(before.loss_fn_outputs) == 3 and len(before.loss_fn_outputs[0]["logprobs"].data) == 6,
          f"per-datum log-probs: {[len(o['logprobs'].data) for o in before.loss_fn_outputs]}")
    check(losses[-1] < 0.5 * losses[0], f"supervised loss:sum falls: {losses[0]:.3f} -> {losses[-1]:.3f}")
    print(f"supervised (cross_entropy, 12 steps): loss:sum {losses[0]:.3f} -> {losses[-1]:.3f}")


def reward(tokens):
    return sum(1 for t in tokens if t % 2 == 0) / max(1, len(tokens))


def rl(training):
    """The cookbook's RL loop: sample from a snapshot, score, importance_sampling on the samples."""
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    params = types.SamplingParams(max_tokens=8, temperature=1.0)
    means = []
    for step in range(20):
        sampler = training.save_weights_and_get_sampling_client(f"rl-{step}")
        futures = [sampler.sample(types.ModelInput.from_ints(p), num_samples=4,
                                  sampling_params=types.SamplingParams(max_tokens=params.max_tokens, seed=100 * step + i))
                   for i, p in enumerate(prompts)]
        data, rewards = [], []
        for prompt, future in zip(prompts, futures):
            seqs = future.result().sequences
            group = [reward(s.tokens) for s in seqs]
            rewards += group
            mean = sum(group) / len(group)
            for s, r in zip(seqs, group):
                tokens = prompt + s.tokens
                n = len(prompt) - 1
                data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
                    "target_tokens": tokens[1:],
                    "logprobs": [0.0] * n + s.logprobs,
                    "advantages": [0.0] * n + [r - mean] * len(s.tokens)}))
        means.append(sum(rewards) / len(rewards))
        fb = training.forward_backward(data, "importance_sampling")
        opt = training.optim_step(types.AdamParams(learning_rate=0.05))
        fb.result()
        opt.result()
    # A rolling window of samplers: at sessions.max_snapshots (8) the oldest made room.
    kept = training._tc.list_snapshots()
    check([s.name for s in kept.snapshots] == [f"rl-{i}" for i in range(12, 20)] and kept.max_snapshots == 8,
          f"the 8 newest snapshots are kept: {[s.name for s in kept.snapshots]}")
    first, last = sum(means[:5]) / 5, sum(means[-5:]) / 5
    check(last > first + 0.15, f"RL mean reward rises: {first:.3f} -> {last:.3f} ({means})")
    print(f"RL (importance_sampling, 20 steps): mean reward first 5 {first:.3f} -> last 5 {last:.3f}")


def snapshot(training):
    """A snapshot samples the same before and after its session trains on."""
    prompt = types.ModelInput.from_ints([9, 8, 7])
    params = types.SamplingParams(max_tokens=6, seed=42)
    sampler = training.save_weights_and_get_sampling_client("frozen")
    first = sampler.sample(prompt, num_samples=3, sampling_params=params).result()
    lp_first = sampler.compute_logprobs(types.ModelInput.from_ints([9, 8, 7, 6, 5])).result()
    live = training.create_sampling_client().sample(prompt, num_samples=3, sampling_params=params).result()
    check([s.tokens for s in live.sequences] == [s.tokens for s in first.sequences],
          "the snapshot samples as its session did when it was taken")
    data = [types.Datum(model_input=types.ModelInput.from_ints([9, 8, 7, 6]),
                        loss_fn_inputs={"target_tokens": [8, 7, 6, 5], "weights": [1.0, 1.0, 1.0, 1.0]})]
    training.forward_backward(data, "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=0.05)).result()
    again = sampler.sample(prompt, num_samples=3, sampling_params=params).result()
    check([(s.tokens, s.logprobs) for s in again.sequences] == [(s.tokens, s.logprobs) for s in first.sequences],
          "the snapshot is frozen: same tokens and log-probs after the session trained")
    lp_again = sampler.compute_logprobs(types.ModelInput.from_ints([9, 8, 7, 6, 5])).result()
    check(lp_first == lp_again and lp_first[0] is None and len(lp_first) == 5, f"snapshot log-probs: {lp_first}")
    moved = training.create_sampling_client().compute_logprobs(types.ModelInput.from_ints([9, 8, 7, 6, 5])).result()
    check(moved != lp_first, "the training session moved on")
    replaced = training.save_weights_and_get_sampling_client("frozen")
    check(replaced.compute_logprobs(types.ModelInput.from_ints([9, 8, 7, 6, 5])).result() == moved,
          "a name used again replaces its snapshot (with the session's weights now)")
    # Prompt log-probs and the top 3 per prompt position (Tinker's topk_prompt_logprobs).
    scored = replaced.sample(types.ModelInput.from_ints([9, 8, 7, 6, 5]), num_samples=1, sampling_params=params,
                            include_prompt_logprobs=True, topk_prompt_logprobs=3).result()
    check(scored.prompt_logprobs == moved, f"prompt_logprobs {scored.prompt_logprobs} vs {moved}")
    top = scored.topk_prompt_logprobs
    check(top is not None and top[0] is None and len(top) == 5 and all(len(p) == 3 for p in top[1:]), f"top: {top}")
    for i, pairs in enumerate(top[1:]):
        values = [v for _, v in pairs]
        check(values == sorted(values, reverse=True), f"position {i}: most likely first {pairs}")
        actual = [9, 8, 7, 6, 5][i + 1]
        check(values[0] >= moved[i + 1] - 1e-12, f"position {i}: the top token is at least as likely as {actual}")
        check(all(close(v, moved[i + 1], 1e-12) for t, v in pairs if t == actual), f"position {i}: same log-prob")


def distillation(training):
    """2-D targets: a teacher's top-k prompt log-probs (a sampler snapshot's, as the cookbook's
    distillation asks its teacher) become cross_entropy's [N, K] target_tokens and weights; the
    loss is -sum p_teacher * log p_student over the candidates, and loss_fn_outputs hold the
    candidates' log-probs, [N, K]."""
    teacher = training.save_weights_and_get_sampling_client("teacher")
    inputs, k = [12, 40, 7, 99, 3], 3
    scored = teacher.sample(types.ModelInput.from_ints(inputs + [0]), 1, types.SamplingParams(max_tokens=1),
                            topk_prompt_logprobs=k).result()
    top = scored.topk_prompt_logprobs[1:]  # entry t: the candidates after inputs[..t]
    check(len(top) == len(inputs) and all(len(row) == k for row in top), f"teacher top-{k}: {top}")
    ids = [[i for i, _ in row] for row in top]
    probs = [[math.exp(lp) for _, lp in row] for row in top]
    datum = types.Datum(model_input=types.ModelInput.from_ints(inputs),
                        loss_fn_inputs={"target_tokens": ids, "weights": probs})
    fb = training.forward_backward([datum], "cross_entropy").result()
    want = -sum(p * lp for row, prow in zip(top, probs) for (_, lp), p in zip(row, prow))
    check(close(fb.metrics["loss:sum"], want, 1e-10), f"top-k cross_entropy loss:sum {fb.metrics['loss:sum']} = {want}")
    out = fb.loss_fn_outputs[0]["logprobs"]
    check(out.shape == [len(inputs), k] and all(close(a, lp, 1e-12) for a, (_, lp) in
                                                 zip(out.data, [pair for row in top for pair in row])),
          f"loss_fn_outputs: the candidates' log-probs [N, K]: {out.shape}")
    training.optim_step(types.AdamParams(learning_rate=0.01)).result()
    print(f"distillation (top-{k} cross_entropy): loss:sum {want:.4f}")


def main() -> int:
    t0 = time.time()
    config = {"log": {"level": "warn"}, "checkpoint_dir": os.path.join(TMP, "tinker-checkpoints"),
              "sessions": {"enabled": True, "max_sessions": 8}}
    (server,) = start(sys.argv[1], ("tinker", config, ("--dtype", "float64")))
    with tinker.ServiceClient(base_url=f"http://{server.target}") as service:
        service._service.wait_ready(60)
        caps = service.get_server_capabilities()
        check(any(o.name == "importance_sampling" for o in caps.objectives), "the server lists its losses")
        training = service.create_lora_training_client(base_model="tiny", rank=8, seed=1, alpha=16,
                                                       target_modules=TARGETS)
        supervised(training)
        snapshot(training)
        distillation(service.create_lora_training_client(base_model="tiny", rank=4, seed=3, alpha=8,
                                                         target_modules=TARGETS))
        rl(service.create_lora_training_client(base_model="tiny", rank=8, seed=2, alpha=16, target_modules=TARGETS))
    print(f"OK ({time.time() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
