#!/usr/bin/env python3
"""The Python SDK without a server: JSONL formats and their errors, typed results against the
proto (no field missing), every RPC reachable from the SDK's source, docstrings on every
public call, the ordering of submitted calls, custom-loss checks, safetensors parsing, the
export folder writer.

    sdk_unit_test.py          (the package from client/python)
"""
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import inspect
import json
import math
import os
import pickle
import random
import struct
import sys
import threading
import time

from sdk_util import PACKAGE_DIR, TMP, check, expect_error as raises

import grpc

import streambp
from streambp import StreambpError, custom_loss, data, pb, types
from streambp._runtime import Runtime, Sequencer, call_forms, release_order
from streambp._weights_folder import FolderWriter


def test_jsonl_formats():
    path = os.path.join(TMP, "sft.jsonl")
    lines = [{"tokens": [1, 2, 3], "loss_mask": [0, 1, 1]}, {"prompt": [1, 2], "completion": [3]},
             {"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"text": "hello"},
             {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "train": True}]},
             {"prompt": "q", "completion": "a"}]
    with open(path, "w") as f:
        f.write("\n".join(json.dumps(x) for x in lines[:3]) + "\n\n" + "\n".join(json.dumps(x) for x in lines[3:]))
    batch = streambp.read_jsonl(path, "sft")
    examples = batch.sft.examples
    check(len(examples) == 6, f"6 sft examples, got {len(examples)}")
    check(list(examples[2].loss_mask) == [0, 1, 1], "labels -100 -> loss mask 0")
    check(examples[3].text == "hello" and examples[4].messages[1].train, "text and messages")
    check(examples[5].prompt_text.text == "q" and examples[5].completion_text.text == "a", "prompt/completion text")
    check(data.batch_has_text(batch) and data.batch_examples(batch) == 6, "has text, 6 examples")
    dpo = streambp.dpo_batch([{"prompt": [1], "chosen": [2], "rejected": [3], "ref_chosen_logp": -1.0,
                               "ref_rejected_logp": -2.0}])
    check(dpo.dpo.pairs[0].HasField("ref_chosen_logp"), "dpo reference log-probs")
    grpo = streambp.grpo_batch([{"prompt": "p", "completions": [{"text": "a", "reward": 1}, {"tokens": [4, 5],
                                                                                             "advantages": [1, 2]}]}])
    check(grpo.grpo.groups[0].prompt_text.text == "p" and len(grpo.grpo.groups[0].completions) == 2, "grpo")
    w = streambp.weighted_batch([[1, 2, 3]], [[0.5, -1.0]], policy_version=4)
    check(w.weighted.policy_version == 4 and list(w.weighted.sequences[0].weights) == [0.5, -1.0], "weighted")
    parts = data.split_by_examples(w, 1)
    check(len(parts) == 1 and parts[0].weighted.policy_version == 4, "split keeps the policy version")
    check(len(data.split_by_examples(batch, 4)) == 2, "split 6 examples by 4")


def test_jsonl_errors():
    cases = [
        ('{"tokens": [1, 2.5]}', "x.jsonl:2: tokens[1] must be an integer token id"),
        ('{"tokens": [1], "extra": 1}', "unknown field 'extra'"),
        ('{"tokens": [1, -3]}', "is not a token id"),
        ('{"tokens": [1, 2], "loss_mask": [1]}', "loss_mask has 1 entries but tokens has 2"),
        ('{"input_ids": [1, 2], "labels": [-100, 3]}', "labels[1] = 3 is neither -100 nor input_ids[1]"),
        ('{"prompt": "a", "completion": [1]}', "must have the same form"),
        ('not json', "x.jsonl:2: not valid JSON"),
        ('{"tokens": [true]}', "tokens[0] must be an integer"),
        ('', "x.jsonl: no examples"),
    ]
    for line, message in cases:
        raises(grpc.StatusCode.INVALID_ARGUMENT, streambp.parse_jsonl, ["\n", line], "sft", "x.jsonl",
               contains=message)
    raises(grpc.StatusCode.INVALID_ARGUMENT, streambp.parse_jsonl, ['{"prompt": [1], "completions": [{"tokens": '
                                                                    '[2]}]}'], "grpo", "g",
           contains="g:1: completions[0]: missing field 'reward'")
    raises(grpc.StatusCode.INVALID_ARGUMENT, streambp.parse_jsonl, ['{"tokens": [1, 2], "weights": [NaN]}'],
           "weighted", "w", contains="not valid JSON")
    raises(grpc.StatusCode.INVALID_ARGUMENT, streambp.parse_jsonl, ['{"tokens": [1, 2, 3], "weights": [1]}'],
           "weighted", "w", contains="weights has 1 entries; it needs 2")
    raises(grpc.StatusCode.INVALID_ARGUMENT, streambp.parse_jsonl, ['{}'], "ppo", contains="no data format")
    raises(grpc.StatusCode.NOT_FOUND, streambp.read_jsonl, os.path.join(TMP, "missing.jsonl"), "sft",
           contains="cannot open data file")
    raises(grpc.StatusCode.INVALID_ARGUMENT, streambp.objective_options, "dpo", {"betta": 1}, contains="betta")
    check(streambp.objective_options("grpo", {"loss_type": "dr_grpo", "beta": 0.0}).loss_type == "dr_grpo",
          "grpo options from a dict")


# The result dataclasses and their messages: every field of the message is in the dataclass.
PAIRS = [
    (types.TokenizerInfo, pb.TokenizerInfo, ()), (types.LoraConfig, pb.LoraConfig, ()),
    (types.SessionInfo, pb.SessionInfo, ()), (types.ServerInfo, pb.GetInfoResponse, ()),
    (types.SessionList, pb.ListSessionsResponse, ()), (types.StepStats, pb.StepStats, ()),
    (types.ForwardBackwardResult, pb.ForwardBackwardResponse, ()),
    (types.OptimStepResult, pb.OptimStepResponse, ()), (types.TrainStepResult, pb.TrainStepResponse, ()),
    (types.StepProgress, pb.StepProgress, ("forward_backward", "train_step")),  # the answer, returned itself
    (types.Completion, pb.Completion, ()), (types.SampleResult, pb.SampleResponse, ()),
    (types.TokenizedText, pb.TokenizedText, ()), (types.CheckpointInfo, pb.SaveCheckpointResponse, ()),
    (types.LoadedCheckpoint, pb.LoadCheckpointResponse, ()), (types.MemoryEstimate, pb.EstimateMemoryResponse, ()),
    (types.PolicyUpdate, pb.PolicyUpdate, ()), (types.RolloutAck, pb.RolloutAck, ()),
    (types.RolloutStats, pb.RolloutStats, ()), (types.RoutedExperts, pb.RoutedExperts, ()),
]


def test_results_cover_the_proto():
    for cls, message, left_out in PAIRS:
        fields = {f.name for f in dataclasses.fields(cls)}
        proto = {f.name for f in message.DESCRIPTOR.fields} - set(left_out)
        check(fields == proto, f"{cls.__name__} vs {message.DESCRIPTOR.name}: missing {sorted(proto - fields)}, "
                               f"extra {sorted(fields - proto)}")
    info = pb.GetInfoResponse(architecture="Qwen3ForCausalLM", num_layers=2, tokenizer=pb.TokenizerInfo(
        available=True, eos_token_ids=[7, 8]))
    converted = types.from_proto(types.ServerInfo, info)
    check(converted.session is None and converted.tokenizer.eos_token_ids == [7, 8], f"GetInfo: {converted}")
    lora = types.from_proto(types.LoraConfig, pb.LoraConfig(r=4))
    check(lora.alpha is None and types.from_proto(types.LoraConfig, pb.LoraConfig(r=4, alpha=8)).alpha == 8,
          "optional fields: None when unset")
    stats = types.from_proto(types.TrainStepResult, pb.TrainStepResponse(
        stats=pb.StepStats(loss=1.5, metrics={"kl": 0.25}), optim=pb.OptimStepResponse(policy_version=3)))
    check(stats.loss == 1.5 and stats.stats.metrics == {"kl": 0.25} and stats.policy_version == 3, f"{stats}")


def test_every_rpc_in_the_sdk():
    source = ""
    for root, _, files in os.walk(os.path.join(PACKAGE_DIR, "streambp")):
        if os.path.basename(root) != "v1":
            source += "".join(open(os.path.join(root, f)).read() for f in files if f.endswith(".py"))
    for method in pb.DESCRIPTOR.services_by_name["Trainer"].methods:
        check(f'"{method.name}"' in source or f"stub.{method.name}(" in source,
              f"the RPC {method.name} is not called anywhere in the SDK")


def test_docstrings():
    for cls in (streambp.ServiceClient, streambp.TrainingClient, streambp.RolloutStream, streambp.StreamIterator):
        check(bool(cls.__doc__), f"{cls.__name__} has no docstring")
        for name, member in inspect.getmembers(cls):
            if name.startswith("_") or not (inspect.isfunction(member) or isinstance(member, property)):
                continue
            check(bool((member.__doc__ or "").strip()), f"{cls.__name__}.{name} has no docstring")
    for name in streambp.__all__:
        member = getattr(streambp, name)
        if inspect.isfunction(member) or inspect.isclass(member):
            check(bool((member.__doc__ or "").strip()), f"streambp.{name} has no docstring")
    tc = streambp.TrainingClient
    for name in ("forward_backward", "train_step", "sample"):
        check(inspect.iscoroutinefunction(getattr(tc, name + "_async")), f"{name}_async is a coroutine function")
        check("_future" in getattr(tc, name).__doc__, f"{name}'s doc names its other forms")


class _Fake:
    """call_forms on a fake server: records the order in which calls are sent."""

    def __init__(self):
        self._runtime = Runtime()
        self._sequencer = Sequencer()
        self.sent = []

    async def _call(self, i: int, ack_delay: float, run_delay: float) -> int:
        await asyncio.sleep(ack_delay)  # the network and the server's queue
        self.sent.append(i)
        release_order()  # the server has queued it
        await asyncio.sleep(run_delay)
        return i

    call, call_future, call_async = call_forms(_call, ordered=True)

    async def _boom(self) -> None:
        self.sent.append("boom")
        raise StreambpError(grpc.StatusCode.INVALID_ARGUMENT, "bad")

    boom, boom_future, boom_async = call_forms(_boom, ordered=True)


def test_submission_order():
    fake = _Fake()
    rng = random.Random(0)
    futures = [fake.call_future(i, rng.random() * 0.01, rng.random() * 0.01) for i in range(20)]
    failed = fake.boom_future()
    futures += [fake.call_future(i, rng.random() * 0.01, 0.0) for i in range(20, 30)]
    check([f.result(10) for f in futures] == list(range(30)), "results")
    check(isinstance(failed.exception(10), StreambpError), "a failed call fails its own future only")
    check(fake.sent == list(range(20)) + ["boom"] + list(range(20, 30)), f"sent out of order: {fake.sent}")

    # From several threads: each thread's calls keep their order.
    fake.sent.clear()
    submitted = []
    lock = threading.Lock()

    def worker(t):
        for k in range(10):
            with lock:  # the submission order across threads is the order of these calls
                submitted.append((t, k))
                futures.append(fake.call_future((t, k), rng.random() * 0.002, 0.0))

    futures = []
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    concurrent.futures.wait(futures, timeout=10)
    check(fake.sent == submitted, "calls from several threads are sent in submission order")

    async def main():
        return await asyncio.gather(*(fake.call_async(i, rng.random() * 0.005, 0.0) for i in range(10)))
    fake.sent.clear()
    check(asyncio.run(main()) == list(range(10)) and fake.sent == list(range(10)), "async forms in order")
    start = time.time()
    check(fake.call(99, 0.0, 0.0) == 99 and time.time() - start < 5, "blocking form")
    fake._runtime.close()
    raises(grpc.StatusCode.CANCELLED, fake.call, 1, 0.0, 0.0, contains="closed")


def test_custom_loss_checks():
    seqs = [[1, 2, 3], [4, 5]]
    logprobs = [[-1.0, -2.0], [-0.5]]

    def good(sequences, lp):
        return sum(map(sum, lp)), [[1.0] * len(x) for x in lp], {"n": 2}
    loss, grads, metrics = custom_loss.run_loss(good, seqs, logprobs, "gradients")
    check(loss == -3.5 and grads == [[1.0, 1.0], [1.0]] and metrics == {"n": 2.0}, "gradients mode")
    raises(grpc.StatusCode.INVALID_ARGUMENT, custom_loss.run_loss, lambda s, lp: (0.0, [[1.0], [1.0]]), seqs,
           logprobs, "gradients", contains="grads[0] has 1 entries; sequence 0 has 2 log-probs")
    raises(grpc.StatusCode.INVALID_ARGUMENT, custom_loss.run_loss, lambda s, lp: (0.0, [[1.0, float("nan")], [1.0]]),
           seqs, logprobs, "gradients", contains="not finite")
    raises(grpc.StatusCode.INVALID_ARGUMENT, custom_loss.run_loss, lambda s, lp: 1.0, seqs, logprobs, "gradients",
           contains="must return (loss, grads)")
    raises(grpc.StatusCode.INVALID_ARGUMENT, custom_loss.run_loss, good, seqs, logprobs, "jax", contains="mode")
    # Without torch (hidden from the import system when it is installed): mode torch is refused
    # and mode auto takes the gradients form.
    with torch_hidden():
        check(not custom_loss.torch_available(), "torch is hidden")
        raises(grpc.StatusCode.INVALID_ARGUMENT, custom_loss.run_loss, good, seqs, logprobs, "torch",
               contains="needs PyTorch")
        check(custom_loss.run_loss(good, seqs, logprobs, "auto")[0] == -3.5, "auto without torch = gradients")
    if not custom_loss.torch_available():
        check(not os.environ.get("CI"), "torch is not importable: CI installs python3-torch (scripts/packages.txt)")
        print("torch is not installed: the torch form of run_loss is not tested here", flush=True)
        return
    # With torch: the SDK differentiates, in mode torch and in mode auto.
    import torch  # pyright: ignore[reportMissingImports]

    def torch_loss(sequences, lp):
        return -torch.log(torch.sigmoid(lp[0].sum() - lp[1].sum())), {"x": torch.tensor(1.0)}
    s = 1 / (1 + math.exp(-(-3.0 + 0.5)))
    for mode in ("torch", "auto"):
        loss, grads, metrics = custom_loss.run_loss(torch_loss, seqs, logprobs, mode)
        check(abs(loss + math.log(s)) < 1e-12, f"{mode}: loss {loss}")
        check(abs(grads[0][0] + (1 - s)) < 1e-12 and abs(grads[0][1] + (1 - s)) < 1e-12 and
              abs(grads[1][0] - (1 - s)) < 1e-12, f"{mode}: torch grads {grads}")
        check(metrics == {"x": 1.0}, f"{mode}: metrics {metrics}")
    # A loss that does not depend on a sequence gets zeros there; a non-scalar or detached loss is refused.
    _, grads, _ = custom_loss.run_loss(lambda s_, lp: -lp[0].sum(), seqs, logprobs, "torch")
    check(grads == [[-1.0, -1.0], [0.0]], f"unused sequence: {grads}")
    raises(grpc.StatusCode.INVALID_ARGUMENT, custom_loss.run_loss, lambda s_, lp: torch.cat(lp), seqs, logprobs,
           "torch", contains="scalar tensor")
    raises(grpc.StatusCode.INVALID_ARGUMENT, custom_loss.run_loss, lambda s_, lp: torch.tensor(1.0), seqs, logprobs,
           "torch", contains="scalar tensor")


@contextlib.contextmanager
def torch_hidden():
    """`import torch` raises ImportError inside the block (None in sys.modules), as without torch."""
    saved = {k: v for k, v in sys.modules.items() if k == "torch" or k.startswith("torch.")}
    for k in saved:
        del sys.modules[k]
    sys.modules["torch"] = None  # pyright: ignore[reportArgumentType]
    try:
        yield
    finally:
        del sys.modules["torch"]
        sys.modules.update(saved)


def safetensors_bytes(tensors, metadata=None):
    header, body = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(body), len(body) + len(raw)]}
        body += raw
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


def test_safetensors():
    raw = safetensors_bytes({"a": ("F64", [2], struct.pack("<2d", 1.5, -2.0)),
                             "b": ("F32", [1, 2], struct.pack("<2f", 0.25, 3.0)),
                             "c": ("BF16", [1], struct.pack("<f", 1.5)[2:]), "d": ("I64", [1], struct.pack("<q", -7))},
                            {"format": "pt"})
    tensors, meta = streambp.safetensors.parse_safetensors(raw)
    check(tensors["a"].values == [1.5, -2.0] and tensors["b"].shape == [1, 2] and tensors["b"].values == [0.25, 3.0],
          "F64 / F32")
    check(tensors["c"].values == [1.5] and tensors["d"].values == [-7] and meta == {"format": "pt"}, "BF16 / I64")
    bad = safetensors_bytes({"a": ("F64", [3], struct.pack("<2d", 1.5, -2.0))})
    raises(grpc.StatusCode.DATA_LOSS, streambp.safetensors.parse_safetensors, bad, contains="a: 16 bytes for shape [3] of F64")
    raises(grpc.StatusCode.DATA_LOSS, streambp.safetensors.parse_safetensors, raw[:20], contains="past the end")


def export_chunks(weights, config, files=(), sha=None):
    """An ExportWeights stream: the weights in 3 pieces, then each side file in one."""
    out, n = [], len(weights)
    cuts = [0, n // 3, 2 * n // 3, n]
    for i in range(3):
        last = i == 2
        out.append(pb.WeightsChunk(policy_version=5, total_bytes=n if i == 0 else 0, offset=cuts[i],
                                   data=weights[cuts[i]:cuts[i + 1]], last=last, format="peft_adapter",
                                   sha256=(sha or hashlib.sha256(weights).hexdigest()) if last else "",
                                   config_json=config if last else ""))
    for name, content in files:
        out.append(pb.WeightsChunk(file=name, total_bytes=len(content), data=content, last=True,
                                   sha256=hashlib.sha256(content).hexdigest()))
    return out


def write_export(folder, chunks, expect=""):
    writer = FolderWriter(folder, expect, "s")
    for c in chunks:
        writer.add(c)
    return writer.finish()


def test_export_writer():
    weights = bytes(range(256)) * 10
    folder = os.path.join(TMP, "export")
    result = write_export(folder, export_chunks(weights, '{"r": 4}', [("tokenizer.json", b"{}")]), "peft_adapter")
    check(result.files == ["adapter_model.safetensors", "adapter_config.json", "tokenizer.json"], f"{result.files}")
    check(open(os.path.join(folder, "adapter_model.safetensors"), "rb").read() == weights, "weights written")
    check(result.policy_version == 5 and result.sha256 == hashlib.sha256(weights).hexdigest(), "result")
    bad = os.path.join(TMP, "bad")
    raises(grpc.StatusCode.DATA_LOSS, write_export, bad, export_chunks(weights, "{}", sha="0" * 64),
           contains="SHA-256")
    check(not any(f.endswith(".partial") for f in os.listdir(bad)), "no partial file left")
    raises(grpc.StatusCode.DATA_LOSS, write_export, bad, export_chunks(weights, "{}", [("../x", b"1")]),
           contains="refusing the file name")
    raises(grpc.StatusCode.DATA_LOSS, write_export, bad, export_chunks(weights, "{}")[:2],
           contains="ended before the last piece")
    gap = export_chunks(weights, "{}")
    del gap[1]
    raises(grpc.StatusCode.DATA_LOSS, write_export, bad, gap, contains="expected")
    raises(grpc.StatusCode.FAILED_PRECONDITION, write_export, os.path.join(TMP, "model"),
           [pb.WeightsChunk(format="model", data=b"x", last=True)], "peft_adapter", contains="not an adapter")
    check(not os.path.exists(os.path.join(TMP, "model")), "nothing written for the wrong format")


def test_errors_and_options():
    e = StreambpError(grpc.StatusCode.FAILED_PRECONDITION, "moved", "rid")
    again = pickle.loads(pickle.dumps(e))
    check(again.code == e.code and again.message == "moved" and again.request_id == "rid", "pickle")
    check(str(e) == "FAILED_PRECONDITION: moved", str(e))
    config = json.loads(streambp.RetryPolicy().service_config())
    check(config["methodConfig"][0]["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"], "retry policy")
    raises(grpc.StatusCode.INVALID_ARGUMENT, streambp.ServiceClient, "")
    group = streambp.rollout_group([1, 2], [types.Completion(0, [3, 4], [-1.0, -2.0], "length", "")], [1.0], 3)
    check(group.prompt == [1, 2] and group.completions[0].logprobs == [-1.0, -2.0] and group.group_id, "group")
    text_group = streambp.rollout_group([{"role": "user", "content": "hi"}], [], [], 0, "g")
    check(text_group.prompt_text.messages[0].content == "hi", "a conversation prompt")
    # Routing replay: the packed ids decode (little-endian, signed) and travel with the group.
    routed = types.from_proto(types.Completion, pb.Completion(tokens=[3], routed_experts=pb.RoutedExperts(
        ids=bytes([1, 0, 0xff, 0xff, 2, 1]), bytes_per_id=2, sparse_layers=1, experts_per_token=3))).routed_experts
    check(routed is not None and routed.to_list() == [1, -1, 258] and routed.per_token() == [[[1, -1, 258]]],
          f"routed experts: {routed}")
    check(types.from_proto(types.Completion, pb.Completion(tokens=[3])).routed_experts is None, "no routing: None")
    with_routing = streambp.rollout_group([1], [types.Completion(0, [3], [-1.0], "length", "", routed)], [1.0], 0)
    check(with_routing.completions[0].routed_experts.ids == routed.ids, "rollout_group carries the routing")


def test_retry_of_a_large_request():
    """A request of ~1 MiB that first meets UNAVAILABLE is sent again by the channel, with
    the same request id (gRPC buffers only 256 KiB per call for retries unless told more)."""
    from concurrent import futures
    from streambp.v1 import trainer_pb2_grpc as pb_grpc

    class Flaky(pb_grpc.TrainerServicer):
        def __init__(self):
            self.seen = []

        def ForwardBackward(self, request, context):
            self.seen.append((request.request_id, request.ByteSize()))
            if len(self.seen) == 1:
                context.abort(grpc.StatusCode.UNAVAILABLE, "try again")
            return pb.ForwardBackwardResponse(policy_version=7)

    flaky = Flaky()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2),
                         options=[("grpc.max_receive_message_length", 64 << 20)])
    pb_grpc.add_TrainerServicer_to_server(flaky, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        tokens = [i % 1000 for i in range(250_000)]  # ~1 MiB of varints
        retry = streambp.RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.05)
        with streambp.ServiceClient(f"127.0.0.1:{port}", retry=retry) as client:
            result = client.training_client().forward_backward([tokens], timeout=30)
        check(result.policy_version == 7, "the retried call's answer")
        check(len(flaky.seen) == 2, f"attempts seen by the server: {len(flaky.seen)}")
        check(flaky.seen[0][0] == flaky.seen[1][0] != "", "one request id for both attempts")
        check(flaky.seen[0][1] > 256 << 10, f"larger than gRPC's default retry buffer: {flaky.seen[0][1]} bytes")
    finally:
        server.stop(None)


def main():
    start = time.time()
    for name, fn in list(globals().items()):
        if name.startswith("test_"):
            t = time.time()
            fn()
            print(f"{name}: ok ({time.time() - t:.2f} s)", flush=True)
    print(f"sdk unit tests: passed ({time.time() - start:.1f} s)")


if __name__ == "__main__":
    main()
