#!/usr/bin/env python3
"""Every RPC of streambp.v1.Trainer through the Python SDK, against a real server with
sessions (a LoRA session): the SDK's calls reach every method (recorded by a client
interceptor), results come back typed, errors raise StreambpError with the gRPC code and
the server's message, a repeated request id is applied once.

    sdk_rpcs_test.py <streambp-server>
"""
import asyncio
import json
import os
import sys
import time

from sdk_util import TMP, check, expect_error, start

import grpc
import grpc.aio

import streambp
from streambp import pb

SFT = [[5, 9, 13, 17, 21, 25], [3, 1, 4, 1, 5, 9, 2, 6]]


class Recorder:
    """Client interceptors (one per call kind, as grpc.aio wants) that record the methods called."""

    def __init__(self):
        self.methods = set()
        methods = self.methods

        class Record:
            async def intercept(self, continuation, details, request):
                method = details.method
                methods.add((method.decode() if isinstance(method, bytes) else method).rsplit("/", 1)[-1])
                return await continuation(details, request)
            intercept_unary_unary = intercept_unary_stream = intercept_stream_unary = intercept_stream_stream = intercept

        kinds = (grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor,
                 grpc.aio.StreamUnaryClientInterceptor, grpc.aio.StreamStreamClientInterceptor)
        self.interceptors = [type("Record" + kind.__name__, (Record, kind), {})() for kind in kinds]


def main() -> int:
    server_bin = sys.argv[1]
    t0 = time.time()
    config = {"log": {"level": "warn"}, "checkpoint_dir": os.path.join(TMP, "checkpoints"),
              "sessions": {"enabled": True, "max_sessions": 4}}
    (server,) = start(server_bin, ("sessions", config, ("--token", "sesame-0123456789abcdef")))
    recorder = Recorder()
    service = streambp.ServiceClient(server.target, token="sesame-0123456789abcdef", interceptors=recorder.interceptors)
    service.wait_ready(60)
    with streambp.ServiceClient(server.target) as anonymous:
        expect_error(grpc.StatusCode.UNAUTHENTICATED, anonymous.info)
    with streambp.ServiceClient("127.0.0.1:1", retry=streambp.RetryPolicy(max_attempts=2)) as nobody:
        expect_error(grpc.StatusCode.UNAVAILABLE, nobody.info, timeout=10)

    info = service.info()
    check(info.sessions and info.vocab_size > 0 and info.session is None, f"GetInfo: {info}")
    vocab = info.vocab_size

    # Sessions.
    session = service.create_session("alice", lora={"r": 4, "alpha": 8}, training={"optimizer": {"name": "sgd",
                                                                                                  "lr": 0.05}},
                                     rollouts={"groups_per_step": 2})
    check(session.name == "alice" and session.kind == "lora" and session.lora.r == 4, f"CreateSession: {session}")
    expect_error(grpc.StatusCode.ALREADY_EXISTS, service.create_session, "alice", lora={"r": 4}, contains="alice")
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, service.create_session, "x", lora={"rank": 4}, contains="rank")
    check([s.name for s in service.list_sessions().sessions] == ["alice"], "ListSessions")
    check(service.get_session("alice").policy_version == 0, "GetSession")
    tc = service.training_client("alice")
    check(tc.info().session.name == "alice", "GetInfo of a session")

    # Steps, with progress (the default route) and unary (pipeline=False).
    states = []
    fb = tc.forward_backward(SFT, on_progress=lambda p: states.append(p.state))
    check(fb.loss > 0 and fb.stats.targets == 12 and fb.policy_version == 0, f"ForwardBackwardProgress: {fb}")
    check("started" in states, f"progress states: {states}")
    optim = tc.optim_step()
    check(optim.policy_version == 1 and optim.step == 1 and not optim.skipped, f"OptimStep: {optim}")
    states.clear()
    step = tc.train_step(streambp.sft_batch(SFT), options={"normalizer": 0}, engine={"engine": "stream"},
                         on_progress=lambda p: states.append(p.state))
    check(step.policy_version == 2 and step.stats.engine.startswith("stream"), f"TrainStepProgress: {step}")
    check("optimizer" in states, f"train step progress states: {states}")
    unary = service.training_client("alice", pipeline=False)
    check(unary.forward_backward(SFT, request_id="same-id").loss > 0, "ForwardBackward (unary)")
    again = unary.forward_backward(SFT, request_id="same-id")  # a retry: answered, not applied again
    check(tc.info().session.pending_micro_batches == 1, "a repeated request id is applied once")
    check(again.loss > 0, "the repeated request id gets the first answer")
    unary.optim_step()
    check(unary.train_step(SFT).policy_version == 4, "TrainStep (unary)")

    # Log-probs, sampling, custom loss.
    lp = tc.compute_logprobs(SFT, fp64=True)
    check([len(x) for x in lp.logprobs] == [5, 7] and lp.policy_version == 4, f"ComputeLogprobs: {lp}")
    check(tc.compute_logprobs(SFT, reference=True).logprobs[0] != lp.logprobs[0], "reference log-probs differ")
    out = tc.sample([[1, 2, 3], [4, 5]], n=2, max_tokens=4, seed=7, temperature=1.0)
    check(len(out.completions) == 4 and len(out.for_prompt(1)) == 2 and out.policy_version == 4, f"Sample: {out}")
    check(all(len(c.tokens) == len(c.logprobs) for c in out.completions), "a log-prob per sampled token")
    custom = tc.forward_backward_custom(SFT, lambda s, lp: (-sum(map(sum, lp)), [[-1.0] * len(x) for x in lp]),
                                        mode="gradients")
    check(custom.policy_version == 4 and custom.forward_backward.stats.targets == 12, f"custom: {custom}")
    # Per-step Adam parameters need an adamw optimizer (alice's is sgd); unknown fields stop in the SDK.
    expect_error(grpc.StatusCode.FAILED_PRECONDITION, tc.optim_step, streambp.AdamParams(),
                 contains="the optimizer is sgd, not adamw")
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, tc.optim_step, {"lr": 1e-3}, contains='no field named "lr"')
    tc.optim_step()

    # Memory, state, weights.
    estimate = tc.estimate_memory(64, 2)
    check(estimate.total_bytes > 0 and estimate.fits, f"EstimateMemory: {estimate}")
    saved = tc.save_state("c1")
    check(saved.name == "c1" and saved.policy_version == 5, f"SaveCheckpoint: {saved}")
    tc.train_step(SFT)
    loaded = tc.load_state("c1")
    check(loaded.policy_version == 5 and tc.info().session.step == saved.step, f"LoadCheckpoint: {loaded}")
    adapter = tc.export_adapter(os.path.join(TMP, "adapter"))
    check(adapter.files == ["adapter_model.safetensors", "adapter_config.json"], f"adapter files: {adapter.files}")
    tensors = streambp.load_safetensors(os.path.join(adapter.path, "adapter_model.safetensors"))
    check(all(n.startswith("base_model.model.") and ".lora_" in n for n in tensors), f"PEFT names: {list(tensors)}")
    check(json.load(open(os.path.join(adapter.path, "adapter_config.json")))["r"] == 4, "adapter_config.json")
    merged = tc.save_weights(os.path.join(TMP, "merged"), merged=True)
    check(merged.format == "model" and merged.files[:2] == ["model.safetensors", "config.json"], f"merged: {merged}")

    # The RL loop: push (unary and stream), the server steps every 2 groups, watch it.
    out = tc.sample([[7, 8, 9], [10, 11]], n=4, max_tokens=5, seed=1)
    groups = [streambp.rollout_group(p, out.for_prompt(i), [float(j) for j in range(4)], out.policy_version)
              for i, p in enumerate([[7, 8, 9], [10, 11]])]
    with tc.watch_policy(since_version=loaded.policy_version, timeout=120) as updates:
        acks = tc.push_rollouts(groups[:1])
        check([a.status for a in acks] == ["accepted"], f"PushRollouts: {acks}")
        with tc.open_rollout_stream() as stream:
            ack = stream.push(groups[1]).result(60)
            duplicate = stream.push(groups[0]).result(60)
        check(ack.status == "accepted" and duplicate.status == "duplicate", f"PushRolloutsStream: {ack} {duplicate}")
        for update in updates:
            if update.source == "rollouts":
                check(update.groups_consumed == 2, f"WatchPolicy: {update}")
                break
    stats = tc.rollout_stats()
    check(stats.steps_run == 1 and stats.consumed == 2 and stats.duplicates == 1, f"GetRolloutStats: {stats}")
    history = tc.history()
    check(history and history[-1].source == "rollouts" and history[-1].groups_consumed == 2
          and history[-1].policy_version == stats.policy_version, f"GetHistory: {history[-1:]}")

    async def first_update():
        async for update in tc.watch_policy_async(since_version=0, timeout=60):
            return update
    first = asyncio.run(first_update())
    check(first is not None and first.policy_version >= 1, f"WatchPolicy (async): {first}")
    check(asyncio.run(tc.info_async()).session.name == "alice", "an _async form")
    check(tc.rollout_stats_future().result(30).accepted == 2, "a _future form")

    # Text on a model without a tokenizer: FAILED_PRECONDITION with the server's message.
    e = expect_error(grpc.StatusCode.FAILED_PRECONDITION, service.tokenize, "hello")
    check(len(e.message) > 10, f"the server's message: {e.message!r}")
    expect_error(grpc.StatusCode.FAILED_PRECONDITION, service.detokenize, [[1, 2]])
    expect_error(grpc.StatusCode.FAILED_PRECONDITION, service.tokenize_batch, streambp.sft_batch(SFT))

    # Errors: the code and the server's message, naming the field; nothing applied.
    version = tc.info().policy_version
    e = expect_error(grpc.StatusCode.INVALID_ARGUMENT, tc.train_step, [[1, vocab + 5]], contains="tokens[1]")
    check(str(vocab + 5) in e.message and e.request_id, f"message and request id: {e.message} {e.request_id}")
    check(tc.info().policy_version == version, "a refused step changes nothing")
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, tc.sample, [[1]], max_tokens=0, contains="max_tokens")
    expect_error(grpc.StatusCode.NOT_FOUND, service.training_client("bob").info, contains="bob")
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, tc.train_step, [[1, 2]], options={"beta": 1},
                 contains="beta")  # a DPO option for an SFT batch: refused before sending

    # Sampler snapshots: frozen weights that sample while the session trains on.
    snap = tc.save_weights_for_sampler("frozen")
    check(snap.name == "frozen" and snap.policy_version == tc.info().policy_version and snap.bytes > 0,
          f"SaveWeightsForSampler: {snap}")
    frozen = tc.sample([[7, 8, 9]], n=2, max_tokens=4, seed=5, snapshot="frozen")
    tc.train_step(SFT)
    again = tc.sample([[7, 8, 9]], n=2, max_tokens=4, seed=5, snapshot="frozen")
    check([c.tokens for c in again.completions] == [c.tokens for c in frozen.completions]
          and again.policy_version == snap.policy_version, "a snapshot samples the same after the session trained")
    check([s.name for s in tc.list_snapshots().snapshots] == ["frozen"], "ListSnapshots")
    expect_error(grpc.StatusCode.ALREADY_EXISTS, tc.save_weights_for_sampler, "frozen", contains="frozen")
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, tc.save_weights_for_sampler, "../x", contains="snapshot name")
    check(tc.delete_snapshot("frozen") == "frozen" and not tc.list_snapshots().snapshots, "DeleteSnapshot")
    expect_error(grpc.StatusCode.NOT_FOUND, tc.sample, [[7, 8, 9]], max_tokens=2, snapshot="frozen", contains="frozen")

    check(service.delete_session("alice") == "alice", "DeleteSession")
    expect_error(grpc.StatusCode.NOT_FOUND, service.get_session, "alice")

    # Tinker's AdamParams on an adamw session: the step takes its learning rate; bad values are
    # refused naming the field, and the gradients stay for the next step.
    adam = service.training_client(service.create_session("tinker", lora={"r": 4}).name)
    adam.forward_backward(SFT)
    step = adam.optim_step(streambp.AdamParams(learning_rate=3e-3))
    check(step.learning_rate == 3e-3 and step.policy_version == 1, f"OptimStep(AdamParams): {step}")
    adam.forward_backward(SFT)
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, adam.optim_step, {"beta1": 1.0},
                 contains="adam_params.beta1 must be in [0, 1), got 1")
    step = adam.optim_step({"learning_rate": 1e-3})
    check(step.learning_rate == 1e-3 and step.policy_version == 2, f"OptimStep(adam_params dict): {step}")
    trained = adam.train_step(SFT, adam_params=streambp.AdamParams(learning_rate=5e-4, grad_clip_norm=1.0))
    check(trained.optim.learning_rate == 5e-4 and trained.policy_version == 3, f"TrainStep(adam_params): {trained}")
    service.delete_session("tinker")

    names = {m.name for m in pb.DESCRIPTOR.services_by_name["Trainer"].methods}
    check(recorder.methods == names, f"RPCs not called: {sorted(names - recorder.methods)}")
    service.close()
    expect_error(grpc.StatusCode.CANCELLED, service.info, contains="closed")
    print(f"sdk rpcs test: passed ({time.time() - t0:.1f} s): all {len(names)} RPCs called through the SDK",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
