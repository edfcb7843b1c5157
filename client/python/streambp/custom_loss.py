"""Custom losses on the client, exact: the loss function of forward_backward_custom runs on
the per-sequence log-probs, and its gradient dL/dlogp becomes the token weights of a
``weighted_logprobs`` batch, whose server-side gradient is then exactly the gradient of the
client's loss (the loss is a function of the log-probs only: the chain rule does the rest).

Two ways to write the loss function ``loss_fn(sequences, logprobs)``:

- mode "torch" (PyTorch installed): ``logprobs`` is a list of float64 tensors with
  requires_grad; return the scalar loss tensor, or (loss, metrics). The SDK differentiates it.
- mode "gradients" (no PyTorch needed): ``logprobs`` is a list of lists of floats; return
  (loss, grads) or (loss, grads, metrics), with grads[s][i] = dL/dlogprobs[s][i].

Mode "auto" is "torch" when torch can be imported, else "gradients".
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Sequence, Tuple

from .errors import invalid

__all__ = ["LossFn", "torch_available", "run_loss"]

#: loss_fn(sequences, logprobs) -> see the module doc.
LossFn = Callable[[List[List[int]], List[Any]], Any]

MODES = ("auto", "torch", "gradients")


def torch_available() -> bool:
    """Whether PyTorch can be imported (mode "auto" then differentiates with it)."""
    try:
        import torch  # noqa: F401  # pyright: ignore[reportMissingImports]
    except ImportError:
        return False
    return True


def run_loss(loss_fn: LossFn, sequences: List[List[int]], logprobs: List[List[float]],
             mode: str = "auto") -> Tuple[float, List[List[float]], Dict[str, float]]:
    """Runs ``loss_fn`` and returns (loss, dL/dlogprobs per sequence, metrics), checked:
    one finite gradient per log-prob."""
    if mode not in MODES:
        raise invalid(f"forward_backward_custom: mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "torch" or (mode == "auto" and torch_available()):
        loss, grads, metrics = _run_torch(loss_fn, sequences, logprobs)
    else:
        loss, grads, metrics = _run_gradients(loss_fn, sequences, logprobs)
    if not math.isfinite(loss):
        raise invalid(f"forward_backward_custom: the loss is not finite ({loss})")
    if len(grads) != len(logprobs):
        raise invalid(f"forward_backward_custom: {len(grads)} gradient lists for {len(logprobs)} sequences")
    checked: List[List[float]] = []
    for s, (g, lp) in enumerate(zip(grads, logprobs)):
        row = [float(x) for x in g]
        if len(row) != len(lp):
            raise invalid(f"forward_backward_custom: grads[{s}] has {len(row)} entries; sequence {s} has "
                          f"{len(lp)} log-probs (one per token after the first)")
        if not all(math.isfinite(x) for x in row):
            raise invalid(f"forward_backward_custom: grads[{s}] is not finite")
        checked.append(row)
    return loss, checked, {k: float(v) for k, v in metrics.items()}


def _run_gradients(loss_fn: LossFn, sequences: List[List[int]],
                   logprobs: List[List[float]]) -> Tuple[float, Sequence[Sequence[float]], Dict[str, Any]]:
    out = loss_fn(sequences, [list(lp) for lp in logprobs])
    if not isinstance(out, tuple) or len(out) not in (2, 3):
        raise invalid("forward_backward_custom (mode gradients): loss_fn must return (loss, grads) or "
                      "(loss, grads, metrics)")
    metrics = out[2] if len(out) == 3 else {}
    return float(out[0]), out[1], dict(metrics)


def _run_torch(loss_fn: LossFn, sequences: List[List[int]],
               logprobs: List[List[float]]) -> Tuple[float, Sequence[Sequence[float]], Dict[str, Any]]:
    try:
        import torch  # pyright: ignore[reportMissingImports]
    except ImportError:
        raise invalid("forward_backward_custom: mode torch needs PyTorch (pip install torch), or use mode "
                      "gradients") from None
    leaves = [torch.tensor(lp, dtype=torch.float64, requires_grad=True) for lp in logprobs]
    out = loss_fn(sequences, leaves)
    loss, metrics = out if isinstance(out, tuple) else (out, {})
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
        raise invalid("forward_backward_custom (mode torch): loss_fn must return a scalar tensor computed from the "
                      "log-probs, or (loss, metrics)")
    loss.backward()
    grads = [leaf.grad.tolist() if leaf.grad is not None else [0.0] * len(lp) for leaf, lp in zip(leaves, logprobs)]
    values = {k: float(v.item() if isinstance(v, torch.Tensor) else v) for k, v in dict(metrics).items()}
    return float(loss.item()), grads, values
