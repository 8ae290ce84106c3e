"""The memory check before a worker holds a second plan generation beside the serving one."""

from __future__ import annotations

from services.stage_worker.overlap import REASON, Footprint, MemoryFacts, overlap_refusal

GIB = 1 << 30
SERVING = Footprint(weight_bytes=2 * GIB, kv_reserve_bytes=GIB, kv_used_bytes=GIB // 4)
NEW = Footprint(weight_bytes=3 * GIB, kv_reserve_bytes=GIB)


def test_both_ranges_fit_under_the_host_and_the_limit():
    # new 4 GiB + the serving range's unallocated 0.75 GiB of KV reserve, against 5 GiB available;
    # 3 + 4 = 7 GiB together under an 8 GiB limit.
    assert overlap_refusal(SERVING, NEW, MemoryFacts(5 * GIB, 8 * GIB)) is None
    assert overlap_refusal(SERVING, NEW, MemoryFacts(5 * GIB, 0)) is None  # no limit: the host bounds it


def test_the_host_refuses_what_it_cannot_give_counting_the_serving_kv_headroom():
    refusal = overlap_refusal(SERVING, NEW, MemoryFacts(4 * GIB + GIB // 2, 0))
    assert refusal is not None and refusal.reason == REASON == "INSUFFICIENT_MEMORY_FOR_OVERLAP"
    need = 4 * GIB + 3 * GIB // 4
    assert f"the host has {4 * GIB + GIB // 2} bytes available, the overlap needs {need} more" in refusal.message
    assert f"new range {3 * GIB} weight bytes + {GIB} KV reserve" in refusal.message


def test_the_limit_refuses_both_ranges_together_and_names_the_figures():
    refusal = overlap_refusal(SERVING, NEW, MemoryFacts(64 * GIB, 7 * GIB - 1))
    assert refusal is not None and refusal.reason == REASON
    assert f"both ranges need {7 * GIB} bytes, the worker's memory limit is {7 * GIB - 1}" in refusal.message
    assert f"serving range {2 * GIB} weight bytes + {GIB} KV reserve ({GIB // 4} in use)" in refusal.message
