"""Shared pieces of the Python SDK tests (tests/python/sdk_*_test.py): starting real servers
on loopback ports, checks that fail with a message, the client package on sys.path."""
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PACKAGE_DIR = os.path.join(ROOT, "client", "python")
if PACKAGE_DIR not in sys.path and "--installed" not in sys.argv:
    sys.path.insert(0, PACKAGE_DIR)

TMP = tempfile.mkdtemp(prefix="streambp-sdk-test-")
_SERVERS = []


def _cleanup():
    for server in _SERVERS:
        server.stop()
    shutil.rmtree(TMP, ignore_errors=True)


atexit.register(_cleanup)


def fail(what):
    print("FAIL:", what, flush=True)
    sys.exit(1)


def check(cond, what):
    if not cond:
        fail(what)


def expect_error(code, fn, *args, contains="", **kwargs):
    """Calls fn(*args, **kwargs), which must raise StreambpError with ``code`` and a message
    containing ``contains``; returns the error."""
    from streambp import StreambpError
    name = getattr(fn, "__name__", repr(fn))
    try:
        fn(*args, **kwargs)
    except StreambpError as e:
        check(e.code == code, f"{name}: expected {code.name}, got {e.code.name}: {e.message}")
        check(contains in e.message, f"{name}: {contains!r} not in the message {e.message!r}")
        return e
    fail(f"{name} did not raise {code.name}")


def close(a, b, tol):
    """|a - b| <= tol * max(1, |a|, |b|) for numbers or equal-length lists of numbers."""
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b))
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


class Server:
    """streambp-server on 127.0.0.1:<free port>, with a JSON config and/or flags; its log in TMP."""

    def __init__(self, server_bin, name, config=None, args=(), threads=1):
        self.name = name
        self.port_file = os.path.join(TMP, name + ".port")
        self.log_path = os.path.join(TMP, name + ".log")
        cmd = [server_bin, "--threads", str(threads), "serve", "--listen", "127.0.0.1:0", "--port-file", self.port_file]
        if config is not None:
            path = os.path.join(TMP, name + ".json")
            with open(path, "w") as f:
                json.dump(config, f)
            cmd += ["--config", path]
        cmd += list(args)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        _SERVERS.append(self)
        self.target = ""

    def wait(self, seconds=120):
        """Waits until it listens; returns its address HOST:PORT."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            if os.path.exists(self.port_file):
                port = open(self.port_file).read().strip()
                if port:
                    self.target = "127.0.0.1:" + port
                    return self.target
            if self.proc.poll() is not None:
                fail(f"server {self.name} exited {self.proc.returncode}: " + open(self.log_path).read()[-3000:])
            time.sleep(0.05)
        fail(f"server {self.name} did not start in {seconds} s")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def start(server_bin, *specs):
    """Starts servers given as (name, config, args) at once (they boot in parallel); returns
    them once all listen."""
    servers = [Server(server_bin, name, config, args) for name, config, args in specs]
    for s in servers:
        s.wait()
    return servers


def text_models_dir():
    """The real tokenizer folders (qwen3, llama3) of the text.reference fixture, or None."""
    for d in (os.environ.get("STREAMBP_TEXT_MODELS"), os.path.join(ROOT, "build", "text_reference", "models")):
        if d and os.path.isfile(os.path.join(d, "qwen3", "tokenizer.json")):
            return d
    return None
