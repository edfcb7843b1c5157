"""Deprecated: the old name of the streambp SDK, kept so that existing scripts run.

New code: ``import streambp`` (streambp.ServiceClient, TrainingClient; client/python/README.md).
``streambp_client.Client`` is the old small client, now a thin layer over the SDK's
default-session TrainingClient: errors raise streambp.StreambpError.
"""
from __future__ import annotations

from typing import Iterable, Iterator, List, Optional, Sequence

from streambp import (Completion, PolicyUpdate, RolloutAck, RolloutStats, SampleResult, ServerInfo, ServiceClient,
                      StreambpError, TrainStepResult, pb, rollout_group, sft_batch)

__all__ = ["Client", "Completion", "SampleResult", "StreambpError", "pb"]

Sampled = Completion  # the old name of a sampled completion


class Client:
    """The old client (default session only). Prefer streambp.ServiceClient."""

    def __init__(self, target: str, token: Optional[str] = None, timeout: float = 600.0,
                 max_message_bytes: int = 64 << 20):
        self.service = ServiceClient(target, token=token, timeout=timeout, max_message_bytes=max_message_bytes)
        self.training = self.service.training_client()

    def close(self) -> None:
        """Closes the connection."""
        self.service.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Blocks until the server is up, or raises StreambpError(UNAVAILABLE)."""
        self.service.wait_ready(timeout)

    def info(self) -> ServerInfo:
        """GetInfo."""
        return self.service.info()

    def rollout_stats(self) -> RolloutStats:
        """GetRolloutStats."""
        return self.training.rollout_stats()

    def train_step_sft(self, examples: Iterable[Sequence[int]], request_id: Optional[str] = None) -> TrainStepResult:
        """One SFT step on token sequences (loss on every token after the first)."""
        return self.training.train_step(sft_batch(examples), request_id=request_id)

    def compute_logprobs(self, sequences: Iterable[Sequence[int]], reference: bool = False,
                         temperature: float = 1.0) -> List[List[float]]:
        """Per-token log-probs of each sequence."""
        return self.training.compute_logprobs(list(sequences), reference=reference, temperature=temperature).logprobs

    def sample(self, prompts: Iterable[Sequence[int]], n: int = 1, max_tokens: int = 16, temperature: float = 1.0,
               top_p: float = 1.0, stop_tokens: Sequence[int] = (), seed: Optional[int] = None) -> SampleResult:
        """Completions of token prompts."""
        return self.training.sample(list(prompts), n=n, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                    stop_tokens=stop_tokens, seed=seed)

    @staticmethod
    def group(prompt: Sequence[int], completions: Sequence[Completion], rewards: Sequence[float],
              policy_version: int, group_id: Optional[str] = None) -> pb.RolloutGroup:
        """A GRPO group from sampled completions and rewards (streambp.rollout_group)."""
        return rollout_group(prompt, completions, rewards, policy_version, group_id)

    def push_rollouts(self, groups: Iterable[pb.RolloutGroup]) -> List[RolloutAck]:
        """PushRollouts."""
        return self.training.push_rollouts(groups)

    def watch_policy(self, since_version: int = 0, timeout: Optional[float] = None) -> Iterator[PolicyUpdate]:
        """One PolicyUpdate per new policy version."""
        return self.training.watch_policy(since_version, timeout=timeout)
