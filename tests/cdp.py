"""A minimal headless-Chromium driver over the DevTools protocol on a pipe (--remote-debugging-pipe):
no extra package, and Chromium itself reports every JavaScript dialog a page opens (which a
--dump-dom run cannot see: a dialog there just hangs the browser)."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import subprocess
import time


class BrowserError(RuntimeError):
    pass


class Chromium:
    """One headless browser with one page. ``dialogs`` collects the dialogs Chromium saw (each
    is dismissed), ``exceptions`` uncaught script errors, ``console_errors`` console.error calls."""

    def __init__(self, executable: str, width: int = 1400, height: int = 1000):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        # the browser reads fd 3 and writes fd 4: move both out of the way of low numbers first
        hi_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 10)
        hi_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 10)

        def child_fds():
            os.dup2(hi_r, 3)        # dup2 leaves the copies inheritable; everything else is close-on-exec
            os.dup2(hi_w, 4)

        args = [executable, "--headless", "--no-sandbox", "--disable-gpu", "--enable-unsafe-swiftshader",
                "--disable-background-networking", "--no-first-run", "--disable-extensions",
                "--remote-debugging-pipe", f"--window-size={width},{height}", "about:blank"]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, preexec_fn=child_fds, close_fds=False)
        for fd in (to_child_r, from_child_w, hi_r, hi_w):
            os.close(fd)
        self._out, self._in = to_child_w, from_child_r
        self._buf = b""
        self._id = 0
        self.session = None
        self.dialogs: list = []
        self.exceptions: list = []
        self.console_errors: list = []
        self.events: list = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page.enable", "Runtime.enable"):
            self.call(domain)
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    # -- the protocol ----------------------------------------------------------------------
    def _send(self, msg: dict) -> None:
        os.write(self._out, json.dumps(msg).encode() + b"\0")

    def _read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise BrowserError("no answer from Chromium in time")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise BrowserError("Chromium closed the pipe: " + self.proc.stderr.read().decode()[-2000:])
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def _event(self, msg: dict) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        self.events.append(method)
        if method == "Page.javascriptDialogOpening":
            self.dialogs.append(f"{params.get('type')}: {params.get('message')}")
            self._id += 1
            self._send(dict(id=self._id, sessionId=self.session, method="Page.handleJavaScriptDialog",
                            params=dict(accept=False)))
        elif method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            self.exceptions.append(d.get("exception", {}).get("description") or d.get("text"))
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.console_errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params["args"]))

    def call(self, method: str, timeout: float = 60, **params):
        self._id += 1
        my = self._id
        msg = dict(id=my, method=method, params=params)
        if self.session:
            msg["sessionId"] = self.session
        self._send(msg)
        while True:
            reply = self._read(timeout)
            if reply.get("id") == my:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self._event(reply)

    def pump(self, seconds: float) -> None:
        """Handle the events that arrive within ``seconds``."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                msg = self._read(max(0.01, end - time.monotonic()))
            except BrowserError:
                return
            if "method" in msg:
                self._event(msg)

    # -- what a test does ------------------------------------------------------------------
    def on_new_document(self, source: str) -> None:
        self.call("Page.addScriptToEvaluateOnNewDocument", source=source)

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def js(self, expression: str, timeout: float = 60):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True,
                      timeout=timeout)
        if "exceptionDetails" in r:
            raise BrowserError(f"{expression[:80]}: {r['exceptionDetails']}")
        return r.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 60):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                value = self.js(expression)
            except BrowserError:
                value = None
            if value:
                return value
            self.pump(0.1)
        raise BrowserError(f"timed out waiting for {expression}")

    def screenshot(self, path, full_page: bool = False) -> bytes:
        params = dict(format="png")
        if full_page:
            size = self.js("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params.update(captureBeyondViewport=True, clip=dict(x=0, y=0, width=size[0], height=min(size[1], 16000),
                                                                 scale=1))
        data = base64.b64decode(self.call("Page.captureScreenshot", **params)["data"])
        with open(path, "wb") as f:
            f.write(data)
        return data

    def close(self) -> None:
        try:
            self.session = None
            self.call("Browser.close", timeout=10)
        except (BrowserError, OSError):
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._out, self._in):
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
