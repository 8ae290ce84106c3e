from __future__ import annotations

import asyncio
import io

import openai
import pytest

from apps.cli.orchestrator import ApiError, ChatTarget, first_model, sse_events, stream_chat
from services.orchestrator.api.http_api import HttpConfig
from tests.integration.orchestrator.harness import MODEL_ID, serve

pytestmark = pytest.mark.integration


def test_chat_client_streams_what_the_api_returns(checkpoint):
    async def main():
        async with serve(checkpoint, http=HttpConfig(api_key="k")) as served:
            target = ChatTarget(served.base_url, "k")
            model = await asyncio.to_thread(first_model, target)
            out = io.StringIO()
            messages = [{"role": "user", "content": "hi"}]
            usage = await asyncio.to_thread(stream_chat, target, model, messages, 5, 0.0,
                                            None, out)
            with pytest.raises(ApiError, match="invalid_api_key"):
                await asyncio.to_thread(first_model, ChatTarget(served.base_url, "bad"))
            api = openai.AsyncOpenAI(base_url=served.base_url, api_key="k", max_retries=0)
            whole = await api.chat.completions.create(model=model, messages=messages,
                                                      max_tokens=5, temperature=0)
            return model, out.getvalue(), usage, whole

    model, text, usage, whole = asyncio.run(main())
    assert model == MODEL_ID
    assert text == whole.choices[0].message.content
    assert usage["completion_tokens"] == whole.usage.completion_tokens


def test_sse_error_event_raises():
    lines = [b'data: {"choices": []}\n', b"\n",
             b'data: {"error": {"code": "cancelled", "message": "gone", "param": null}}\n']
    events = sse_events(lines)
    assert next(events) == {"choices": []}
    with pytest.raises(ApiError, match="cancelled: gone"):
        next(events)
