"""Headless Debian chromium driven over the DevTools protocol (aiohttp websocket), for tests
that need a real browser: navigate, evaluate in the page, capture a screenshot."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,900", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1")
START_TIMEOUT_S = 60.0


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One chromium process and one page, closed by `close()`."""

    def __init__(self) -> None:
        self._profile = tempfile.mkdtemp(prefix="fornax-chromium-")
        binary = chromium_binary()
        if binary is None:
            raise RuntimeError("chromium is not installed (scripts/ci_system_deps.sh)")
        self._proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._ids = itertools.count(1)
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None

    async def open(self) -> Browser:
        port = await self._devtools_port()
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{port}/json/list") as response:
            pages = [t for t in await response.json() if t["type"] == "page"]
        self._ws = await self._session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)
        await self.call("Page.enable")
        return self

    async def _devtools_port(self) -> int:
        marker = Path(self._profile, "DevToolsActivePort")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not marker.exists() or not marker.read_text().strip():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("chromium did not open its DevTools port")
            await asyncio.sleep(0.1)
        return int(marker.read_text().splitlines()[0])

    async def call(self, method: str, **params: Any) -> dict:
        assert self._ws is not None
        message_id = next(self._ids)
        await self._ws.send_str(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            reply = json.loads((await self._ws.receive()).data)
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    async def navigate(self, url: str) -> None:
        await self.call("Page.navigate", url=url)

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                                 awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def screenshot(self, path: Path) -> Path:
        shot = await self.call("Page.captureScreenshot", format="png")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._session is not None:
            await self._session.close()
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        shutil.rmtree(self._profile, ignore_errors=True)
