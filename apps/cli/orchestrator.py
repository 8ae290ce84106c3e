"""`fornax chat "..."`: a small streaming client for the OpenAI-compatible API."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TextIO
from urllib.parse import urlsplit

DEFAULT_API = "http://127.0.0.1:8000/v1"


@dataclass(frozen=True)
class ChatTarget:
    base_url: str
    api_key: str | None


class ApiError(Exception):
    pass


def register(commands, benches) -> None:
    chat = commands.add_parser("chat", help="stream a chat completion from the running fleet")
    chat.add_argument("prompt", help="the user message")
    chat.add_argument("--base-url", help=f"API base URL (default: .fornax/fleet.json `api`, "
                                          f"else {DEFAULT_API})")
    chat.add_argument("--state-dir", default=".fornax", help="fleet state directory")
    chat.add_argument("--model", help="model id (default: the first one /v1/models lists)")
    chat.add_argument("--system", help="an optional system message")
    chat.add_argument("--max-tokens", type=int, default=128)
    chat.add_argument("--temperature", type=float, default=0.0)
    chat.add_argument("--seed", type=int)
    chat.set_defaults(func=_chat_command)


def resolve_target(base_url: str | None, state_dir: str) -> ChatTarget:
    """Flag first, then the fleet file's `api`, then the default; the key from the same."""
    fleet_api = fleet_key = None
    path = os.path.join(state_dir, "fleet.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            body = json.load(handle)
        fleet_api, fleet_key = body.get("api"), body.get("api_key")
    return ChatTarget(base_url or fleet_api or DEFAULT_API,
                      os.environ.get("FORNAX_API_KEY") or fleet_key)


def sse_events(lines: Iterable[bytes]) -> Iterator[dict]:
    """JSON payloads of `data:` lines until `[DONE]`; an error event raises ApiError."""
    for raw in lines:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        event = json.loads(data)
        if "error" in event:
            raise ApiError(_describe(event["error"]))
        yield event


def _describe(error: dict) -> str:
    param = f" (param {error['param']})" if error.get("param") else ""
    return f"{error.get('code')}: {error.get('message')}{param}"


def _request(target: ChatTarget, method: str, path: str, body: dict | None):
    url = urlsplit(target.base_url.rstrip("/") + path)
    if not url.hostname:
        raise ValueError(f"the API base URL {target.base_url!r} names no host")
    conn_type = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    conn = conn_type(url.hostname, url.port, timeout=600)
    headers = {"Content-Type": "application/json"}
    if target.api_key:
        headers["Authorization"] = f"Bearer {target.api_key}"
    conn.request(method, url.path, body=None if body is None else json.dumps(body),
                 headers=headers)
    response = conn.getresponse()
    if response.status >= 400:
        payload = json.loads(response.read() or b"{}")
        raise ApiError(f"HTTP {response.status} " + _describe(payload.get("error", {})))
    return response


def first_model(target: ChatTarget) -> str:
    models = json.loads(_request(target, "GET", "/models", None).read())["data"]
    if not models:
        raise ApiError("the API serves no model yet (no route installed)")
    return models[0]["id"]


def stream_chat(target: ChatTarget, model: str, messages: list[dict], max_tokens: int,
                temperature: float, seed: int | None, out: TextIO) -> dict:
    """Writes deltas to `out` as they arrive; returns the usage of the final event."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens,
            "temperature": temperature, "stream": True, "stream_options": {"include_usage": True}}
    if seed is not None:
        body["seed"] = seed
    response = _request(target, "POST", "/chat/completions", body)
    usage: dict = {}
    for event in sse_events(response):
        for choice in event.get("choices", []):
            out.write(choice.get("delta", {}).get("content") or "")
            out.flush()
        usage = event.get("usage") or usage
    return usage


def _chat_command(args: argparse.Namespace) -> int:
    target = resolve_target(args.base_url, args.state_dir)
    messages = ([{"role": "system", "content": args.system}] if args.system else [])
    messages.append({"role": "user", "content": args.prompt})
    try:
        model = args.model or first_model(target)
        usage = stream_chat(target, model, messages, args.max_tokens, args.temperature,
                            args.seed, sys.stdout)
    except (ApiError, OSError) as exc:
        print(f"\nfornax chat: {target.base_url}: {exc}", file=sys.stderr)
        return 1
    print()
    if usage:
        print(f"[{usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion "
              f"tokens]", file=sys.stderr)
    return 0
