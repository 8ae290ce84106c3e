"""A large prompt is tokenized on a worker thread, so the event loop keeps serving streams."""

from __future__ import annotations

import asyncio
import threading

import aiohttp

from services.orchestrator.api import http_api
from tests.integration.orchestrator.harness import MODEL_ID, serve


def test_large_prompts_are_tokenized_off_the_event_loop(checkpoint, monkeypatch):
    threads: list[bool] = []
    encode = http_api.completion_prompt_ids

    def recording(*args):
        threads.append(threading.current_thread() is threading.main_thread())
        return encode(*args)

    monkeypatch.setattr(http_api, "completion_prompt_ids", recording)

    async def main():
        async with serve(checkpoint) as served, aiohttp.ClientSession() as session:
            statuses = []
            for prompt in ("hello there", "hello there " * 3000):
                body = {"model": MODEL_ID, "prompt": prompt, "max_tokens": 1}
                async with session.post(f"{served.base_url}/completions", json=body) as response:
                    statuses.append(response.status)
            return statuses

    statuses = asyncio.run(main())
    assert statuses[0] == 200 and statuses[1] in (200, 400)  # 400: longer than the context
    assert threads == [True, False]  # the small one inline, the large one on a worker thread
