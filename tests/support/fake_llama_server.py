"""A stand-in `llama-server` for tests: a real HTTP process speaking the part of its CLI and
OpenAI `/v1/completions` streaming API that `fornax bench serve --peer llama.cpp` uses.

Each request streams exactly `max_tokens` chunks when `ignore_eos` is set (else stops after one),
then a usage chunk and `[DONE]`; a prompt that is not a list of token ids gets HTTP 400. Like the
real server it remembers prompts unless a request sets `cache_prompt: false`, and a prompt it has
seen before is reported as served from the cache (`prompt_tokens_details.cached_tokens`: all but
its last token); `--always-cache` ignores `cache_prompt`.
The native `/completion` answers once, with the generated ids under `tokens` when `return_tokens`
is set: token i of a prompt starting at id p is p + i, except that `--diverge-after K` makes every
stream's tokens from index K on differ (so that tests see a disagreeing peer).
"""

from __future__ import annotations

import argparse
import asyncio
import json

from aiohttp import web


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("-c", "--ctx-size", type=int, default=4096)
    parser.add_argument("-np", "--parallel", type=int, default=1)
    parser.add_argument("-t", "--threads", type=int, default=1)
    parser.add_argument("--no-jinja", action="store_true")
    parser.add_argument("--chat-template")
    parser.add_argument("--diverge-after", type=int, default=None)
    parser.add_argument("--always-cache", action="store_true")
    return parser.parse_args(argv)


def token_ids(prompt: list[int], count: int, diverge_after: int | None) -> list[int]:
    return [prompt[0] + i + (1 if diverge_after is not None and i >= diverge_after else 0) for i in range(count)]


async def health(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    prompt = body.get("prompt")
    if not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
        return web.json_response({"error": {"message": "prompt must be token ids"}}, status=400)
    count = int(body["max_tokens"]) if body.get("ignore_eos") else 1
    cached = _cached_tokens(request.app, prompt, body.get("cache_prompt", True))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for i in range(count):
        await asyncio.sleep(0.002)
        chunk = {"choices": [{"index": 0, "text": f" t{prompt[0] + i}", "finish_reason": None}]}
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    usage = {"choices": [], "usage": {"completion_tokens": count, "prompt_tokens": len(prompt),
                                      "prompt_tokens_details": {"cached_tokens": cached}}}
    await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
    return response


def _cached_tokens(app: web.Application, prompt: list[int], cache_prompt: bool) -> int:
    if not (cache_prompt or app["always_cache"]):
        return 0
    seen = app["prompts"]
    cached = len(prompt) - 1 if tuple(prompt) in seen else 0
    seen.add(tuple(prompt))
    return cached


async def completion(request: web.Request) -> web.Response:
    body = await request.json()
    prompt = body.get("prompt")
    if not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
        return web.json_response({"error": {"message": "prompt must be token ids"}}, status=400)
    ids = token_ids(prompt, int(body["n_predict"]) if body.get("ignore_eos") else 1, request.app["diverge_after"])
    answer = {"content": "".join(f" t{t}" for t in ids), "tokens": ids if body.get("return_tokens") else [],
              "tokens_predicted": len(ids), "stop": True}
    return web.json_response(answer)


def main() -> None:
    args = parse()
    with open(args.model, "rb") as handle:
        if handle.read(4) != b"GGUF":
            raise SystemExit("not a GGUF file")
    app = web.Application()
    app["diverge_after"] = args.diverge_after
    app["always_cache"] = args.always_cache
    app["prompts"] = set()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/completion", completion)
    web.run_app(app, host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
