"""A small typed wrapper of the streambp.v1 Trainer service for Python rollout workers.

Needs Debian's python3-grpcio and python3-protobuf, and the stubs that the build
generates into <build>/python:  PYTHONPATH=<build>/python:client/python.

    from streambp_client import Client
    c = Client("127.0.0.1:50051")
    out = c.sample([[1, 2, 3]], n=8, max_tokens=16, seed=0)
    acks = c.push_rollouts([c.group([1, 2, 3], out.completions, rewards, out.policy_version)])
    for update in c.watch_policy(since_version=0): ...

Every call has a deadline (`timeout`, seconds). Errors raise grpc.RpcError with the
server's status code and message.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Iterable, Iterator, List, Optional, Sequence

import grpc

from streambp.v1 import trainer_pb2 as pb
from streambp.v1 import trainer_pb2_grpc as pb_grpc

__all__ = ["Client", "Sampled", "pb"]


@dataclass
class Sampled:
    """One completion: its tokens, the sampler's log-prob of each, and why it ended."""

    prompt_index: int
    tokens: List[int]
    logprobs: List[float]
    finish_reason: str


@dataclass
class SampleResult:
    completions: List[Sampled] = field(default_factory=list)
    policy_version: int = 0


class Client:
    """A connection to streambp-server. Thread-safe (one gRPC channel)."""

    def __init__(self, target: str, token: Optional[str] = None, timeout: float = 600.0,
                 max_message_bytes: int = 64 << 20):
        options = [("grpc.max_send_message_length", max_message_bytes),
                   ("grpc.max_receive_message_length", max_message_bytes)]
        self._channel = grpc.insecure_channel(target, options=options)
        self._stub = pb_grpc.TrainerStub(self._channel)
        self._metadata = [("authorization", f"Bearer {token}")] if token else []
        self.timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Blocks until the channel connects (the server is up), or raises."""
        grpc.channel_ready_future(self._channel).result(timeout=timeout)

    # -- info ---------------------------------------------------------------------------
    def info(self) -> pb.GetInfoResponse:
        return self._stub.GetInfo(pb.GetInfoRequest(), timeout=30, metadata=self._metadata)

    def rollout_stats(self) -> pb.RolloutStats:
        return self._stub.GetRolloutStats(pb.GetRolloutStatsRequest(), timeout=30, metadata=self._metadata)

    # -- training -----------------------------------------------------------------------
    def train_step_sft(self, examples: Iterable[Sequence[int]], request_id: Optional[str] = None
                       ) -> pb.TrainStepResponse:
        """One SFT step on token sequences (loss on every token after the first)."""
        batch = pb.Batch(sft=pb.SftBatch(examples=[pb.SftExample(tokens=list(e)) for e in examples]))
        req = pb.TrainStepRequest(request_id=request_id or uuid.uuid4().hex, batch=batch)
        return self._stub.TrainStep(req, timeout=self.timeout, metadata=self._metadata)

    def compute_logprobs(self, sequences: Iterable[Sequence[int]], reference: bool = False,
                         temperature: float = 1.0) -> List[List[float]]:
        req = pb.ComputeLogprobsRequest(sequences=[pb.TokenSequence(tokens=list(s)) for s in sequences],
                                        reference=reference, temperature=temperature)
        resp = self._stub.ComputeLogprobs(req, timeout=self.timeout, metadata=self._metadata)
        return [list(s.logprobs) for s in resp.sequences]

    # -- the RL loop --------------------------------------------------------------------
    def sample(self, prompts: Iterable[Sequence[int]], n: int = 1, max_tokens: int = 16,
               temperature: float = 1.0, top_p: float = 1.0, stop_tokens: Sequence[int] = (),
               seed: Optional[int] = None) -> SampleResult:
        req = pb.SampleRequest(prompts=[pb.TokenSequence(tokens=list(p)) for p in prompts], n=n,
                               max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                               stop_tokens=list(stop_tokens))
        if seed is not None:
            req.seed = seed
        resp = self._stub.Sample(req, timeout=self.timeout, metadata=self._metadata)
        return SampleResult([Sampled(c.prompt_index, list(c.tokens), list(c.logprobs), c.finish_reason)
                             for c in resp.completions], resp.policy_version)

    @staticmethod
    def group(prompt: Sequence[int], completions: Sequence[Sampled], rewards: Sequence[float],
              policy_version: int, group_id: Optional[str] = None) -> pb.RolloutGroup:
        """A GRPO group from sampled completions (their log-probs go along) and rewards."""
        if len(completions) != len(rewards):
            raise ValueError("one reward per completion")
        return pb.RolloutGroup(
            prompt=list(prompt), policy_version=policy_version, group_id=group_id or uuid.uuid4().hex,
            completions=[pb.GrpoCompletion(tokens=c.tokens, logprobs=c.logprobs, reward=float(r))
                         for c, r in zip(completions, rewards)])

    def push_rollouts(self, groups: Iterable[pb.RolloutGroup]) -> List[pb.RolloutAck]:
        resp = self._stub.PushRollouts(pb.PushRolloutsRequest(groups=list(groups)), timeout=self.timeout,
                                       metadata=self._metadata)
        return list(resp.acks)

    def watch_policy(self, since_version: int = 0, timeout: Optional[float] = None) -> Iterator[pb.PolicyUpdate]:
        """Yields one PolicyUpdate per new policy version (the current one first)."""
        return self._stub.WatchPolicy(pb.WatchPolicyRequest(since_version=since_version), timeout=timeout,
                                      metadata=self._metadata)
