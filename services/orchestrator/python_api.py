"""Python API: `Engine(...).generate(prompt) -> str` over the same serving core.

The engine owns a private event loop on a background thread, so `generate` is an ordinary
blocking call that is safe to use from several threads at once; concurrent calls are
batched together like HTTP requests.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from libs.common.kinds import Backend
from libs.text.chat_template import ChatMessage
from libs.text.context import TextContext
from services.orchestrator.api.openai_request import CommonOptions, generation_request
from services.orchestrator.engine.domain import FinishReason, SamplingParams
from services.orchestrator.engine.pipeline import Pipeline
from services.orchestrator.engine.serving import ServingConfig, ServingEngine, build_engine
from services.orchestrator.route.inprocess_pipeline import InProcessPipeline, InProcessRouteConfig


@dataclass(frozen=True)
class Generation:
    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int


class Engine:
    def __init__(self, checkpoint_dir: str | Path, *, stages: int = 1, backend: str = "numpy",
                 model_id: str = "fornax", config: ServingConfig = ServingConfig()) -> None:
        route = InProcessRouteConfig(Path(checkpoint_dir), stages, Backend(backend), model_id=model_id)
        self._start(lambda: InProcessPipeline.from_checkpoint(route),
                    TextContext.from_checkpoint(checkpoint_dir), config)

    @classmethod
    def over(cls, make_pipeline: Callable[[], Pipeline], text: TextContext,
             config: ServingConfig = ServingConfig()) -> Engine:
        """An engine over any Pipeline with a `served` model (made on the engine's loop)."""
        engine = cls.__new__(cls)
        engine._start(make_pipeline, text, config)
        return engine

    def _start(self, make_pipeline: Callable[[], Pipeline], text: TextContext,
               config: ServingConfig) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fornax-engine",
                                        daemon=True)
        self._thread.start()

        async def build() -> ServingEngine:
            pipeline = make_pipeline()
            return build_engine(config, pipeline, text)

        self._serving = self._call(build())

    def _call(self, coro):
        future: Future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result()

    def generate(self, prompt: str, *, max_tokens: int | None = None, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                 stop: tuple[str, ...] = (), chat: bool = False) -> str:
        """Completes `prompt` (greedy by default); `chat=True` wraps it as one user turn."""
        return self.generate_full(prompt, max_tokens=max_tokens, temperature=temperature,
                                  top_p=top_p, top_k=top_k, seed=seed, stop=stop,
                                  chat=chat).text

    def generate_full(self, prompt: str, *, max_tokens: int | None = None,
                      temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                      seed: int | None = None, stop: tuple[str, ...] = (),
                      chat: bool = False) -> Generation:
        serving = self._serving
        text = serving.text
        ids = tuple(text.encode_chat([ChatMessage("user", prompt)]) if chat
                    else text.tokenizer.encode(prompt))
        options = CommonOptions(max_tokens=max_tokens, sampling=SamplingParams(
            temperature=temperature, top_k=top_k, top_p=top_p, seed=seed), stop=tuple(stop), stream=False,
            include_usage=False)
        request = generation_request(str(uuid.uuid4()), ids, options, serving.served,
                                     serving.config.token_limits, "prompt")
        return self._call(_run(serving, request))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._call(self._serving.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


async def _run(serving: ServingEngine, request) -> Generation:
    async with serving.submit(request) as stream:
        done = await stream.collect()
    final = done.final
    assert final.finish_reason is not None  # a collected stream ends with its finish reason
    return Generation(done.text, final.finish_reason, final.prompt_tokens, final.completion_tokens)
