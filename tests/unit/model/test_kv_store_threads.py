"""The KV store is shared by the event loop (release) and the device thread (commit):
concurrent use never raises and its byte accounting stays exact."""

import sys
import threading

import numpy as np

from libs.model.kv_store import KvLayout, KvStore, kv_slice

LAYOUT = KvLayout(layer_count=2, kv_lora_rank=4, rope_dim=2)


def test_commit_release_and_usage_from_three_threads_stay_consistent():
    store = KvStore(LAYOUT, bytes_limit=1 << 40)
    keys = [(f"r{i}", f"l{i}") for i in range(3000)]
    rows = (np.ones((2, 1, 4), np.float32), np.ones((2, 1, 2), np.float32))
    errors: list[BaseException] = []
    start = threading.Barrier(3)
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible

    def device():
        start.wait()
        for request, lease in keys:
            store.commit(kv_slice(request, lease, 0, 0, 0, 1), *rows)

    def loop_releases():
        start.wait()
        for request, lease in keys[::2]:
            store.release(request, lease)

    done = threading.Event()

    def observer():
        start.wait()
        while not done.is_set():  # reads the whole table while the others change it
            usage = store.usage()
            assert usage.bytes_used == usage.live_sequences * store.block_bytes

    def run(target):
        try:
            target()
        except BaseException as exc:  # reported below, with the thread's failure
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in (device, loop_releases, observer)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads[:2]:
            thread.join()
        done.set()
        threads[2].join()
    finally:
        sys.setswitchinterval(old_interval)
    assert errors == []
    live = store.usage().live_sequences
    assert store.bytes_used() == live * store.block_bytes
    assert live == 1500  # every odd key survives; an even one never does (a commit after release stores nothing)
