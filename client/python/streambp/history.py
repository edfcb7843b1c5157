"""A session's training history (GetHistory): one record per optimizer step, as dataclasses,
flat dicts (the server's metrics.jsonl lines) or a pandas DataFrame."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from ._runtime import Runtime, call_forms
from .types import from_proto
from .v1 import trainer_pb2 as pb

if TYPE_CHECKING:
    import pandas

__all__ = ["HistoryRecord", "HistoryMixin"]


@dataclass(frozen=True)
class HistoryRecord:
    """One optimizer step of a session (see GetHistory in proto/streambp/v1/trainer.proto):
    ``source`` is "train" (TrainStep), "optim_step" (ForwardBackward calls + OptimStep) or
    "rollouts" (a server-run rollout step); ``metrics`` are the objective's (reward_mean, kl,
    clip_ratio/..., ...)."""
    index: int
    step: int
    policy_version: int
    source: str
    time: float
    loss: float
    tokens: int
    forward_backwards: int
    tokens_per_second: float
    seconds: float
    peak_memory_bytes: int
    grad_norm: float
    learning_rate: float
    skipped: bool
    skip_reason: str
    groups_consumed: int
    metrics: Dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> Dict[str, Any]:
        """The record flat, as a metrics.jsonl line: the fields, then the metrics by name."""
        row: Dict[str, Any] = {k: v for k, v in self.__dict__.items() if k != "metrics"}
        for name, value in self.metrics.items():
            row[f"objective/{name}" if name in row else name] = value
        return row


class HistoryMixin:
    """GetHistory for TrainingClient (which provides ``_conn`` and ``session``)."""

    _conn: Any
    _runtime: Runtime
    session: str

    async def _history(self, after_index: int = 0, max_records: Optional[int] = None, *,
                       timeout: Optional[float] = None) -> List[HistoryRecord]:
        """The session's history, oldest first: records with index > ``after_index`` (0: from the
        oldest the server keeps), at most ``max_records`` (None: all, read page by page). Poll
        with the last index seen to follow training."""
        records: List[HistoryRecord] = []
        while max_records is None or len(records) < max_records:
            want = 0 if max_records is None else max_records - len(records)
            request = pb.GetHistoryRequest(session=self.session, after_index=after_index, max_records=want)
            response = await self._conn.unary("GetHistory", request, timeout or self._conn.info_timeout)
            page = [from_proto(HistoryRecord, r) for r in response.records]
            records.extend(page)
            if not page or page[-1].index >= response.last_index:
                break
            after_index = page[-1].index
        return records

    history, history_future, history_async = call_forms(_history)

    def history_frame(self, after_index: int = 0, *, timeout: Optional[float] = None) -> "pandas.DataFrame":
        """The history as a pandas DataFrame indexed by ``index``: a column per field and per
        metric (NaN where a step has no such metric). Needs pandas."""
        try:
            import pandas
        except ImportError as e:  # pragma: no cover - the message is the point
            raise ImportError("history_frame needs pandas (pip install pandas); history() returns plain records") from e
        rows = [r.as_dict() for r in self.history(after_index, timeout=timeout)]
        frame = pandas.DataFrame(rows)
        return frame if frame.empty else frame.set_index("index")
