#!/usr/bin/env python3
"""The training dashboard in a real browser (issue 29): a server with two sessions that
train side by side; headless Chromium (Debian's) loads /dashboard, and the rendered DOM must
hold, for each session, one curve per chart with exactly as many points as the session's
history has steps with that value (loss, reward, grad norm, lr, tokens/s, memory); more
steps give more points; a screenshot is kept as an artifact. Then the rules: with bearer
tokens the dashboard is off unless metrics.dashboard is "on", and its JSON reads take the
same tokens as the gRPC port (none: 401; a scoped token sees its own sessions only).

    dashboard_test.py <streambp-server> <screenshot.png>

Without chromium: exit 77 (skipped), or a failure under CI=true.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from sdk_util import check, start

import streambp
from streambp import pb

TMP = tempfile.mkdtemp(prefix="dashboard-")
CHARTS = ["loss", "reward_mean", "grad_norm", "learning_rate", "tokens_per_second", "peak_memory_bytes"]


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def browser_args(browser):
    # As root (CI containers) Chromium needs --no-sandbox; /dev/shm may be small there.
    return [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
            f"--user-data-dir={os.path.join(TMP, 'profile')}", "--virtual-time-budget=15000"]


def render(browser, url):
    """The DOM after the page's first refresh (virtual time lets its fetches finish)."""
    out = subprocess.run(browser_args(browser) + ["--dump-dom", url], capture_output=True, text=True, timeout=120)
    check(out.returncode == 0 and "<html" in out.stdout, f"chromium --dump-dom failed: {out.stderr[-2000:]}")
    return out.stdout


def curves(dom):
    """{(session, metric): points} from the rendered charts."""
    found = {}
    for tag in re.findall(r"<svg [^>]*class=\"chart\"[^>]*>", dom):
        attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', tag))
        found[(attrs["data-session"], attrs["data-metric"])] = int(attrs["data-points"])
    return found


def polyline_points(dom, session, metric):
    m = re.search(r'<svg [^>]*data-session="%s" data-metric="%s"[^>]*>(.*?)</svg>' % (session, metric), dom, re.S)
    check(m is not None, f"no chart {session}/{metric}")
    line = re.search(r'<polyline class="curve" points="([^"]*)"', m.group(1))
    return 0 if line is None else len(line.group(1).split())


def expected(tc):
    """Points each chart must have: the steps whose record carries a finite value."""
    records = tc.history()
    want = {}
    for metric in CHARTS:
        n = 0
        for r in records:
            v = r.metrics.get(metric) if metric == "reward_mean" else getattr(r, metric)
            n += (v is not None and not r.skipped and v == v and abs(v) != float("inf"))
        want[metric] = n
    return want


def http(url, token=None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def dashboard_base(server):
    """The dashboard's address from the server's log, or None once it logged its metrics port without one."""
    for _ in range(400):
        text = open(server.log_path).read()
        m = re.search(r"dashboard on (http://[0-9.]+:[0-9]+)/dashboard", text)
        if m:
            return m.group(1)
        if "metrics on http" in text:
            return None
        time.sleep(0.05)
    return None


def sft(seed):
    return streambp.sft_batch([[1 + (seed * 7 + t * 5) % 200 for t in range(8 + seed % 3)]])


def grpo():
    group = pb.GrpoGroup(prompt=[3, 9, 27], completions=[pb.GrpoCompletion(tokens=[40, 41], reward=1.0),
                                                         pb.GrpoCompletion(tokens=[50, 51, 52], reward=0.0)])
    return pb.Batch(grpo=pb.GrpoBatch(groups=[group]))


def main() -> int:
    server_bin, screenshot = sys.argv[1], sys.argv[2]
    browser = chromium()
    if browser is None:
        if os.environ.get("CI") == "true":
            print("FAIL (CI=true): chromium is not installed (scripts/packages.txt has it)")
            return 1
        print("SKIPPED: chromium is not installed")
        return 77
    t0 = time.time()
    config = {"log": {"level": "info"}, "checkpoint_dir": os.path.join(TMP, "ckpt"),
              "sessions": {"enabled": True}, "metrics": {"listen": "127.0.0.1:0"}}
    (server,) = start(server_bin, ("open", config, ()))
    base = dashboard_base(server)
    check(base is not None, "no 'dashboard on' line in the log")
    service = streambp.ServiceClient(server.target)
    service.wait_ready(60)
    for name in ("alice", "bob"):
        service.create_session(name, lora={"r": 4}, training={"optimizer": {"name": "adamw", "lr": 1e-2}})
    alice, bob = service.training_client("alice"), service.training_client("bob")
    # Side by side: the two sessions' steps interleave on the device.
    futures = [alice.train_step_future(sft(i)) for i in range(4)] + [bob.train_step_future(sft(10 + i)) for i in range(2)]
    for f in futures:
        f.result()
    bob.train_step(grpo(), objective="grpo")

    dom = render(browser, base + "/dashboard")
    got = curves(dom)
    for name, tc in (("alice", alice), ("bob", bob)):
        want = expected(tc)
        for metric in CHARTS:
            check(got.get((name, metric)) == want[metric],
                  f"{name}/{metric}: {got.get((name, metric))} points drawn, {want[metric]} recorded")
            check(polyline_points(dom, name, metric) == want[metric], f"{name}/{metric}: polyline points")
    check(got[("alice", "loss")] == 4 and got[("bob", "loss")] == 3 and got[("bob", "reward_mean")] == 1,
          f"curves: {got}")
    check('data-refreshes="1"' in dom or re.search(r'data-refreshes="[1-9]', dom), "the page did not refresh")

    # More steps, more points.
    for i in range(2):
        alice.train_step(sft(20 + i))
    dom = render(browser, base + "/dashboard?poll=500")
    check(curves(dom)[("alice", "loss")] == 6, f"after two more steps: {curves(dom)}")
    os.makedirs(os.path.dirname(os.path.abspath(screenshot)), exist_ok=True)
    shot = subprocess.run(browser_args(browser) + ["--window-size=1400,1000", f"--screenshot={screenshot}",
                                                   base + "/dashboard"], capture_output=True, text=True, timeout=120)
    check(shot.returncode == 0 and os.path.getsize(screenshot) > 10000,
          f"no screenshot: {shot.stderr[-1500:]}")
    check(open(screenshot, "rb").read(8) == b"\x89PNG\r\n\x1a\n", "the screenshot is not a PNG")

    # JSON reads: bad input named.
    status, body = http(base + "/dashboard/history?session=alice&after=-3")
    check(status == 400 and "after" in json.loads(body)["error"], f"after=-3: {status} {body}")
    status, body = http(base + "/dashboard/history?session=carol")
    check(status == 404 and "carol" in json.loads(body)["error"], f"unknown session: {status} {body}")
    service.close()
    server.stop()

    # Auth: off by default with tokens; on when asked, with the gRPC port's token rules.
    tokens = {"tokens": ["admin-0123456789abcdef"], "scoped_tokens": [{"token": "alice-0123456789abcdef", "sessions": ["alice"]}]}
    closed = dict(config, checkpoint_dir=os.path.join(TMP, "ckpt2"), auth=tokens)
    on = dict(closed, checkpoint_dir=os.path.join(TMP, "ckpt3"), metrics={"listen": "127.0.0.1:0", "dashboard": "on"})
    s_closed, s_on = start(server_bin, ("closed", closed, ()), ("on", on, ()))
    check(dashboard_base(s_closed) is None, "with tokens the dashboard must be off unless metrics.dashboard is on")
    base = dashboard_base(s_on)
    check(base is not None, "metrics.dashboard on: no dashboard")
    with streambp.ServiceClient(s_on.target, token="admin-0123456789abcdef") as admin:
        admin.wait_ready(60)
        for name in ("alice", "bob"):
            admin.create_session(name, lora={"r": 2})
        admin.training_client("bob").train_step(sft(1))
    status, body = http(base + "/dashboard/sessions")
    check(status == 401 and "Bearer" in json.loads(body)["error"], f"no token: {status} {body}")
    status, body = http(base + "/dashboard/sessions", "wrong-token-0123456789")
    check(status == 401, f"a bad token: {status} {body}")
    status, body = http(base + "/dashboard/sessions", "alice-0123456789abcdef")
    check(status == 200 and [s["name"] for s in json.loads(body)["sessions"]] == ["alice"], f"scoped: {body}")
    status, body = http(base + "/dashboard/history?session=bob", "alice-0123456789abcdef")
    check(status == 404, f"a scoped token reading another session: {status} {body}")
    status, body = http(base + "/dashboard/history?session=bob", "admin-0123456789abcdef")
    check(status == 200 and len(json.loads(body)["records"]) == 1, f"admin: {status} {body}")
    dom = render(browser, base + "/dashboard#token=admin-0123456789abcdef")
    check(curves(dom).get(("bob", "loss")) == 1, f"the page with a token in its fragment: {curves(dom)}")
    s_closed.stop()
    s_on.stop()
    print(f"dashboard: two sessions drawn point for point in Chromium, screenshot {screenshot}, "
          f"token rules held ({time.time() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
