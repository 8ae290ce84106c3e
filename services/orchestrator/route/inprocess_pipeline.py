"""A Pipeline whose stages are `libs.model` stage executors inside this process.

Each stage runs on its own single worker thread, so while stage 1 works on one microbatch
stage 0 can already work on the next, as separate stage workers would. Used by tests, by the
Python Engine and as the reference the networked route is compared with.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from libs.common.kinds import Backend
from libs.model.config import load_config
from libs.model.errors import ModelError, UnknownSequenceError
from libs.model.executor import StageBatch, StageExecutor, StageSpec
from libs.model.kernels import make_kernels
from libs.model.layout import even_layer_split
from libs.model.logprobs import TokenLogprobs, decode_record, sample_records
from libs.model.weights import load_stage_weights
from libs.service.errors import FornaxError
from libs.structured.decoding import DecodingTable
from libs.structured.grammar import GrammarVocabulary
from services.orchestrator.engine.domain import (
    Microbatch,
    ReleaseReport,
    RequestSlice,
    RequestSliceResult,
    ServedModel,
    StageStats,
    failed_result,
    sequence_ok,
)
from services.orchestrator.engine.model_card import checkpoint_snapshot, route_card, served_model


@dataclass(frozen=True)
class InProcessRouteConfig:
    checkpoint_dir: Path
    stages: int
    backend: Backend = Backend.NUMPY
    kv_limit_bytes_per_stage: int = 256 << 20
    model_id: str = "fornax"


class InProcessPipeline:
    def __init__(self, executors: list[StageExecutor], served: ServedModel,
                 grammar_vocab: GrammarVocabulary | None = None) -> None:
        self._executors = executors
        self.served = served
        # The final stage's per-request grammar and penalty state.
        self._decoding = DecodingTable(served.vocab_size, grammar_vocab)
        self._compute_ns = [0] * len(executors)
        self._batches = self._compute_ns[:]
        self._threads = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"stage{i}")
                         for i in range(len(executors))]
        self._generation = uuid.uuid4()
        self.generation = str(self._generation)

    @classmethod
    def from_checkpoint(cls, config: InProcessRouteConfig) -> InProcessPipeline:
        cfg = load_config(config.checkpoint_dir)
        ranges = even_layer_split(cfg.num_hidden_layers, config.stages)
        executors = []
        for index, (start, end) in enumerate(ranges):
            first, last = index == 0, index == len(ranges) - 1
            weights = load_stage_weights(config.checkpoint_dir, cfg, start, end, first, last)
            kernels = make_kernels(config.backend, cfg, weights)
            spec = StageSpec(start, end, first, last, config.kv_limit_bytes_per_stage)
            executors.append(StageExecutor(cfg, spec, kernels))
        tokenizer = Path(config.checkpoint_dir, "tokenizer.json")
        vocab = (GrammarVocabulary(tokenizer.read_text(encoding="utf-8"), cfg.vocab_size)
                 if tokenizer.exists() else None)
        served = replace(served_model(cfg, ranges, config.model_id,
                                      config.kv_limit_bytes_per_stage),
                         card=route_card(checkpoint_snapshot(str(config.checkpoint_dir)),
                                         config.backend, "fp32", "", "in-process"))
        return cls(executors, served, vocab)

    @property
    def num_stages(self) -> int:
        return len(self._executors)

    def lease_id(self, request_id: str) -> str:
        return str(uuid.uuid5(self._generation, f"fnx2:inprocess:{request_id}"))

    async def submit(self, batch: Microbatch) -> tuple[RequestSliceResult, ...]:
        slices = tuple(s.with_lease(self.lease_id(s.request_id)) for s in batch.slices)
        idents = tuple(s.sequence for s in slices)
        token_ids = np.fromiter((t for s in slices for t in s.token_ids), dtype=np.int32)
        sampling = tuple(s.sampling for s in slices)
        for piece, params in zip(slices, sampling, strict=True):
            self._decoding.open(piece.request_id, params)
        ids = [s.request_id for s in slices]
        positions = [s.sequence.token_position_start + len(s.token_ids) - 1 for s in slices]
        try:
            filters = self._decoding.filters(ids, positions) if len(self._decoding) else ()
        except FornaxError as exc:
            return _failed(slices, f"sampling state: {exc.reason}: {exc.message}")
        loop = asyncio.get_running_loop()
        hidden, pending, tokens = None, [], None
        for index, executor in enumerate(self._executors):
            last = index == len(self._executors) - 1
            stage_batch = StageBatch(slices=idents, token_ids=token_ids if index == 0 else None,
                                     hidden=hidden, sampling=sampling if last else (),
                                     token_filters=filters if last else ())
            try:
                result, new_kv = await loop.run_in_executor(self._threads[index], _timed,
                                                            executor, stage_batch,
                                                            self._compute_ns, index)
            except ModelError as exc:
                return _failed(slices, f"stage {index}: {exc.reason}: {exc.message}")
            hidden, tokens = result.hidden, result.token_ids
            self._batches[index] += 1
            pending.append(new_kv)
        assert tokens is not None
        # As on the networked route, a stage commits its new KV only once every later stage
        # has run the batch too: a failure anywhere leaves every stage's epoch unchanged.
        epochs = await asyncio.gather(*(
            loop.run_in_executor(thread, executor.commit, new_kv)
            for thread, executor, new_kv in zip(self._threads, self._executors, pending, strict=True)))
        self._decoding.accept(ids, positions, tokens.tolist())
        wanted = [s.sampling.top_logprobs for s in slices]
        records = (sample_records(result.logits, tokens) if any(k is not None for k in wanted)
                   else None)

        def logprobs(i: int):
            top = wanted[i]
            return None if top is None or records is None else decode_record(records[i], top)

        return tuple(_sequence_result(s, int(tokens[i]), [stage[i] for stage in epochs], logprobs(i))
                     for i, s in enumerate(slices))

    async def cancel(self, request_id: str) -> None:
        """Nothing to drop: an in-process stage runs a microbatch to its end."""

    async def release(self, request_id: str, publish_token_ids: tuple[int, ...] = ()) -> ReleaseReport:
        """In-process stages admit no prefixes, so nothing is published."""
        self._decoding.close(request_id)
        loop = asyncio.get_running_loop()
        epochs = await asyncio.gather(*(
            loop.run_in_executor(thread, self._release_one, executor, request_id)
            for thread, executor in zip(self._threads, self._executors, strict=True)))
        return ReleaseReport(request_id, tuple(epochs))

    def _release_one(self, executor: StageExecutor, request_id: str) -> int:
        lease = self.lease_id(request_id)
        try:
            epoch = executor.kv.epoch((request_id, lease))
        except UnknownSequenceError:
            epoch = 0
        executor.release(request_id, lease)
        return epoch

    async def stage_stats(self) -> list[StageStats]:
        """Threads of this process: compute time only (no queue, pack, wire or unpack)."""
        out = []
        for index, executor in enumerate(self._executors):
            usage = executor.kv_usage()
            blocks = usage.blocks
            out.append(StageStats(index, "in-process", usage.bytes_used, usage.bytes_limit,
                                  usage.live_sequences, self._batches[index],
                                  compute_ns=self._compute_ns[index],
                                  kv_blocks_free=blocks.free_blocks if blocks else 0,
                                  kv_blocks_total=blocks.total_blocks if blocks else 0,
                                  prefix_hit_blocks=blocks.hit_blocks if blocks else 0,
                                  prefix_missed_blocks=blocks.missed_blocks if blocks else 0,
                                  kv_evicted_blocks=blocks.evicted_blocks if blocks else 0))
        return out

    def live_kv_sequences(self) -> list[int]:
        return [executor.kv_usage().live_sequences for executor in self._executors]

    async def close(self) -> None:
        for thread in self._threads:
            thread.shutdown(wait=False, cancel_futures=True)


def _timed(executor: StageExecutor, batch: StageBatch, compute_ns: list[int], index: int):
    started = time.perf_counter_ns()
    try:
        return executor.run(batch)
    finally:
        compute_ns[index] += time.perf_counter_ns() - started


def _sequence_result(piece: RequestSlice, token: int, stage_epochs: list[int],
                     logprobs: TokenLogprobs | None) -> RequestSliceResult:
    if len(set(stage_epochs)) != 1:
        return failed_result(piece, f"stages disagree on the KV epoch: {stage_epochs}")
    return RequestSliceResult(sequence_ok(piece, stage_epochs[0]), token, logprobs=logprobs)


def _failed(slices: tuple[RequestSlice, ...], error: str) -> tuple[RequestSliceResult, ...]:
    return tuple(failed_result(s, error) for s in slices)
