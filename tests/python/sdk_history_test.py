#!/usr/bin/env python3
"""A session's training history through the Python SDK against a real server: history()
equals what every step answered (TrainStep, ForwardBackward + OptimStep, GRPO with its
metrics), paged and followed with after_index; history_frame() is a pandas DataFrame of the
same values; the server's metrics.jsonl holds them line for line; and its TensorBoard event
file, read back here by an independent reader (the TFRecord framing and masked CRC-32C
written from the format, the Event/Summary messages decoded by Google's protobuf runtime
from a descriptor built in this file), carries the same scalars.

    sdk_history_test.py <streambp-server>
"""
import glob
import json
import os
import struct
import sys
import tempfile
import time

from sdk_util import check, expect_error, start

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

import streambp
from streambp import pb

TMP = tempfile.mkdtemp(prefix="sdk-history-")


# --- An independent reader of TensorBoard event files -------------------------------------

def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def event_class():
    """tensorflow.Event with its Summary, declared here (the fields the format defines)."""
    f = descriptor_pb2.FileDescriptorProto(name="tb_event_reader.proto", package="tbreader", syntax="proto3")
    value = f.message_type.add(name="Value")
    value.field.add(name="tag", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                    label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT,
                    label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    summary = f.message_type.add(name="Summary")
    summary.field.add(name="value", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                      type_name=".tbreader.Value", label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED)
    event = f.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE,
                    label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
                    label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                    label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    event.field.add(name="summary", number=5, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                    type_name=".tbreader.Summary", label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    desc = pool.FindMessageTypeByName("tbreader.Event")
    get = getattr(message_factory, "GetMessageClass", None)
    return get(desc) if get else message_factory.MessageFactory(pool).GetPrototype(desc)


def read_events(path):
    """Every Event in the file, each frame's two checksums verified."""
    Event = event_class()
    data = open(path, "rb").read()
    events, pos = [], 0
    while pos < len(data):
        check(pos + 12 <= len(data), f"{path}: a torn frame header at {pos}")
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        check(length_crc == masked(header), f"{path}: the length's checksum at {pos}")
        payload = data[pos + 12:pos + 12 + length]
        (payload_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        check(payload_crc == masked(payload), f"{path}: the payload's checksum at {pos}")
        event = Event()
        event.ParseFromString(payload)
        events.append(event)
        pos += 16 + length
    return events


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


# --- The test ---------------------------------------------------------------------------

SFT = [[1, 5, 9, 13, 17, 21], [2, 4, 8, 16, 32, 64, 128]]


def grpo_batch():
    group = pb.GrpoGroup(prompt=[3, 9, 27], completions=[
        pb.GrpoCompletion(tokens=[40, 41, 42], reward=1.0),
        pb.GrpoCompletion(tokens=[51, 52, 53, 54], reward=0.0),
        pb.GrpoCompletion(tokens=[62, 63], reward=0.5)])
    return pb.Batch(grpo=pb.GrpoBatch(groups=[group]))


def main() -> int:
    server_bin = sys.argv[1]
    t0 = time.time()
    checkpoints = os.path.join(TMP, "checkpoints")
    config = {"log": {"level": "warn"}, "checkpoint_dir": checkpoints, "history": {"tensorboard": True},
              "trainer": {"optimizer": {"name": "adamw", "lr": 1e-3}}}
    (server,) = start(server_bin, ("history", config, ("--dtype", "float64")))
    service = streambp.ServiceClient(server.target)
    service.wait_ready(60)
    tc = service.training_client()
    check(tc.history() == [], "a fresh server's history is empty")

    # What every step answered: (source, loss, tokens, forward_backwards, metrics, optim).
    answered = []
    for i in range(3):
        r = tc.train_step(streambp.sft_batch([[t + i for t in ex] for ex in SFT]))
        answered.append(("train", r.stats.loss, r.stats.tokens, 1, r.stats.metrics, r.optim))
    a = tc.forward_backward(SFT)
    b = tc.forward_backward([[t + 1 for t in ex] for ex in SFT])
    o = tc.optim_step()
    mean = {k: (a.stats.metrics[k] + b.stats.metrics[k]) / 2 for k in a.stats.metrics}
    answered.append(("optim_step", (a.loss + b.loss) / 2, a.stats.tokens + b.stats.tokens, 2, mean, o))
    r = tc.train_step(grpo_batch(), objective="grpo")
    answered.append(("train", r.stats.loss, r.stats.tokens, 1, r.stats.metrics, r.optim))
    check(abs(r.stats.metrics["reward_mean"] - 0.5) < 1e-12, f"GRPO metrics: {r.stats.metrics}")

    history = tc.history()
    check(len(history) == len(answered), f"{len(history)} records for {len(answered)} steps")
    for i, (rec, (source, loss, tokens, fbs, metrics, optim)) in enumerate(zip(history, answered)):
        got = (rec.index, rec.source, rec.loss, rec.tokens, rec.forward_backwards, rec.metrics, rec.step,
               rec.policy_version, rec.grad_norm, rec.learning_rate, rec.skipped)
        want = (i + 1, source, loss, tokens, fbs, dict(metrics), optim.step, optim.policy_version, optim.grad_norm,
                optim.learning_rate, optim.skipped)
        check(got == want, f"record {i + 1}: {got} != {want}")
        check(rec.seconds > 0 and abs(rec.tokens_per_second - tokens / rec.seconds) <= 1e-9 * rec.tokens_per_second,
              f"record {i + 1}: tokens/s {rec.tokens_per_second} for {tokens} tokens in {rec.seconds} s")

    # Paging and following.
    check([x.index for x in tc.history(after_index=2, max_records=2)] == [3, 4], "history(after_index=2, max_records=2)")
    check(tc.history(after_index=5) == [], "nothing after the newest")
    check([x.index for x in tc.history_future(after_index=3).result()] == [4, 5], "history_future")
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, tc.history, after_index=-1, contains="after_index")

    # pandas.
    frame = tc.history_frame()
    check(list(frame.index) == [1, 2, 3, 4, 5], f"frame index {list(frame.index)}")
    check(list(frame["loss"]) == [x.loss for x in history], "frame loss column")
    check(frame["reward_mean"].isna().tolist() == [True, True, True, True, False], "reward_mean only on the GRPO step")
    check(frame.loc[5, "reward_mean"] == history[4].metrics["reward_mean"], "frame reward_mean")

    # metrics.jsonl: the same records, flat.
    lines = [json.loads(x) for x in open(os.path.join(checkpoints, "metrics.jsonl")) if x.strip()]
    check(lines == [x.as_dict() for x in history], f"metrics.jsonl differs from GetHistory:\n{lines[0]}\n{history[0]}")

    # TensorBoard: one event file, a version event, then one event per step with its scalars.
    files = glob.glob(os.path.join(checkpoints, "tensorboard", "events.out.tfevents.*"))
    check(len(files) == 1, f"event files: {files}")
    events = read_events(files[0])
    check(events[0].file_version == "brain.Event:2", f"first event: {events[0]}")
    steps = events[1:]
    check(len(steps) == len(history), f"{len(steps)} step events for {len(history)} records")
    for ev, rec in zip(steps, history):
        scalars = {v.tag: v.simple_value for v in ev.summary.value}
        check(ev.step == rec.step and ev.wall_time == rec.time, f"event step/time {ev.step} {ev.wall_time} vs {rec}")
        want = {"train/loss": rec.loss, "train/grad_norm": rec.grad_norm, "train/learning_rate": rec.learning_rate,
                "train/tokens": rec.tokens, "train/tokens_per_second": rec.tokens_per_second,
                "train/seconds": rec.seconds, "train/peak_memory_bytes": rec.peak_memory_bytes,
                "train/policy_version": rec.policy_version}
        want.update({"objective/" + k: v for k, v in rec.metrics.items()})
        check(scalars == {k: f32(v) for k, v in want.items()}, f"step {rec.step}: {scalars} != {want}")

    service.close()
    server.stop()
    print(f"sdk_history: {len(history)} records equal on the wire, in pandas, metrics.jsonl and TensorBoard "
          f"({time.time() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
