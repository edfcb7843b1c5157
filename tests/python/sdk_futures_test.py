#!/usr/bin/env python3
"""Futures and async of the Python SDK against real servers: 8 forward_backward futures from
one TrainingClient, interleaved with optim_step futures and all submitted at once, complete
and equal the same calls made one by one on an identical server (every loss, and the final
weights): submission order is application order. The same with the _async forms and
asyncio.gather on a third server.

    sdk_futures_test.py <streambp-server>
"""
import asyncio
import os
import sys
import time

from sdk_util import TMP, check, close, start

import streambp

ARGS = ["--dtype", "float64", "--optimizer", "sgd", "--lr", "0.5"]
QUIET = {"log": {"level": "warn"}}
TOL = 1e-12


def batches():
    """8 different SFT batches (token ids below the tiny model's vocabulary)."""
    return [streambp.sft_batch([[(7 * i + 3 * k) % 200 + 1 for k in range(6 + i)], [i + 1, i + 2, i + 3]])
            for i in range(8)]


def plan():
    """The calls: 8 forward_backward, an optim_step after every 2."""
    calls = []
    for i, b in enumerate(batches()):
        calls.append(("fb", b))
        if i % 2 == 1:
            calls.append(("optim", None))
    return calls


def results_of(values):
    """Comparable numbers: the loss of each forward_backward, the version after each optim_step."""
    out = []
    for v in values:
        out.append(v.loss if isinstance(v, streambp.ForwardBackwardResult) else float(v.policy_version))
    return out


def weights(tc, name):
    folder = os.path.join(TMP, name)
    tc.save_weights(folder, with_files=False)
    return streambp.load_safetensors(os.path.join(folder, "model.safetensors"))


def same_weights(a, b, what):
    check(sorted(a) == sorted(b), f"{what}: tensor names differ")
    worst = max(max((abs(x - y) for x, y in zip(a[n].values, b[n].values)), default=0.0) for n in a)
    check(worst <= TOL, f"{what}: weights differ by {worst:g}")


def main() -> int:
    server_bin = sys.argv[1]
    t0 = time.time()
    seq_server, fut_server, async_server = start(server_bin, ("sequential", QUIET, ARGS), ("futures", QUIET, ARGS),
                                                 ("async", QUIET, ARGS))
    print(f"3 servers up in {time.time() - t0:.1f} s", flush=True)

    with streambp.ServiceClient(seq_server.target) as service:
        tc = service.training_client()
        expected = []
        for kind, batch in plan():
            expected.append(tc.forward_backward(batch) if kind == "fb" else tc.optim_step())
        expected_weights = weights(tc, "sequential")

    with streambp.ServiceClient(fut_server.target) as service:
        tc = service.training_client()
        queued = []

        def on_progress(p: streambp.StepProgress) -> None:
            if p.state == "queued":
                queued.append(p.queue_position)
        t = time.time()
        futures = [tc.forward_backward_future(batch, on_progress=on_progress) if kind == "fb"
                   else tc.optim_step_future() for kind, batch in plan()]
        got = [f.result(timeout=120) for f in futures]
        print(f"12 futures ({sum(1 for k, _ in plan() if k == 'fb')} forward_backward) in {time.time() - t:.2f} s; "
              f"the deepest queue position seen: {max(queued, default=0)}", flush=True)
        check(close(results_of(got), results_of(expected), TOL),
              f"futures differ from the sequential calls:\n{results_of(got)}\n{results_of(expected)}")
        same_weights(weights(tc, "futures"), expected_weights, "futures vs sequential")

    with streambp.ServiceClient(async_server.target) as service:
        tc = service.training_client()

        async def run():
            return await asyncio.gather(*(tc.forward_backward_async(batch) if kind == "fb" else tc.optim_step_async()
                                          for kind, batch in plan()))
        got = asyncio.run(run())
        check(close(results_of(got), results_of(expected), TOL), "async calls differ from the sequential calls")
        same_weights(weights(tc, "async"), expected_weights, "async vs sequential")

    print(f"sdk futures test: passed ({time.time() - t0:.1f} s): 8 forward_backward + 4 optim_step futures (and "
          "their _async forms) equal the same calls in sequence, losses and final weights", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
