"""Top-1 agreement of a served route with transformers in float32, teacher-forced.

For each prompt, transformers' greedy continuation is the reference sequence. At every position
of the continuation the route is asked for one greedy token given the reference prefix, so one
disagreement does not carry into the next position. With fp32 boundaries agreement is expected
to be exact; with bf16 boundaries it is the figure that says what bf16 costs.
"""

from __future__ import annotations

import asyncio
import uuid


def reference_sequences(checkpoint: str, prompt_ids: list[list[int]], new_tokens: int) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    with torch.no_grad():
        return [model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False)[0].tolist()
                for ids in prompt_ids]


async def _served_tokens(orchestrator: str, prompts: list[list[int]], max_tokens: int, concurrency: int = 8,
                         channel_config=None) -> list[tuple[int, ...]]:
    """Each prompt's greedy continuation of up to `max_tokens` ids from the orchestrator's Generate
    (it ends early where the route samples end-of-sequence)."""
    from fornax.orchestrator.v1 import orchestrator_pb2 as pb
    from fornax.orchestrator.v1 import orchestrator_pb2_grpc as pb_grpc
    from libs.service.channels import ChannelConfig, open_aio_channel

    gate = asyncio.Semaphore(concurrency)
    async with open_aio_channel(orchestrator, channel_config or ChannelConfig()) as channel:
        stub = pb_grpc.OrchestratorServiceStub(channel)

        async def one(prompt: list[int]) -> tuple[int, ...]:
            request = pb.GenerateRequest(request_id=str(uuid.uuid4()), model="fornax",
                                         token_ids=pb.TokenIds(ids=prompt),
                                         sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0))
            async with gate:
                return tuple([t async for reply in stub.Generate(request, timeout=600) for t in reply.token_ids])

        return list(await asyncio.gather(*(one(p) for p in prompts)))


async def _served_next_tokens(orchestrator: str, prefixes: list[list[int]], concurrency: int = 8,
                              channel_config=None) -> list[int]:
    ids = await _served_tokens(orchestrator, prefixes, 1, concurrency, channel_config)
    return [i[0] if i else -1 for i in ids]


def served_greedy_ids(orchestrator: str, prompts: list[tuple[int, ...]], max_tokens: int,
                      channel_config=None) -> list[tuple[int, ...]]:
    """The served route's greedy ids for each prompt (untimed; for comparing with a peer's)."""
    return asyncio.run(_served_tokens(orchestrator, [list(p) for p in prompts], max_tokens,
                                      channel_config=channel_config))


def top1_agreement(checkpoint: str, orchestrator: str, prompt_ids: list[list[int]], new_tokens: int,
                   channel_config=None) -> dict:
    """Fraction of positions where the route's greedy token equals the fp32 reference's.
    `channel_config` carries the fleet's client credentials (an mTLS fleet refuses plaintext)."""
    references = reference_sequences(checkpoint, prompt_ids, new_tokens)
    prefixes, expected = [], []
    for prompt, sequence in zip(prompt_ids, references, strict=True):
        for position in range(len(prompt), len(sequence)):
            prefixes.append(sequence[:position])
            expected.append(sequence[position])
    served = asyncio.run(_served_next_tokens(orchestrator, prefixes, channel_config=channel_config))
    matches = sum(a == b for a, b in zip(served, expected, strict=True))
    return {"top1_agreement": matches / max(1, len(expected)), "positions": len(expected),
            "reference": "transformers float32 greedy, teacher-forced per position"}
