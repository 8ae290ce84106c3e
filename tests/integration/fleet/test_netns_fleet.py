"""`fornax up --fleet`: hosts as network namespaces with cgroup quotas, shaped links and a skewed
clock. Greedy text through the openai client equals transformers; a multi-turn chat reuses its
earlier turns' KV (cached_tokens grows) with the same text as without reuse; `fornax down`
leaves nothing.

Needs root and namespaces (CI is root); skipped elsewhere. numpy on every host keeps it quick.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import uuid
from pathlib import Path

import openai
import pytest
import yaml

from apps.fleet.netns import cgroup_pids, leftovers, read_record
from libs.service.fleet_state import read_fleet
from libs.text.context import TextContext
from tests.integration.orchestrator.harness import tiny_checkpoint
from tests.integration.orchestrator.test_greedy_parity import reference_greedy

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or not Path("/proc/self/ns/net").exists(),
                       reason="netns fleets need root and namespaces"),
]
REPO = Path(__file__).resolve().parents[3]
SKEW_S = 7200
PROMPTS = ([5, 17, 42], [7, 8, 9, 10, 11])


def _fornax(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apps.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def _two_hosts(path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "version": 1, "control_host": "alpha", "boundary_dtype": "fp32",
        "hosts": [
            {"name": "alpha", "backend": "numpy", "cpu_cores": 1.0, "memory_limit": "3GiB",
             "link": {"rate": "1Gbit/s"}},
            {"name": "beta", "backend": "numpy", "cpu_cores": 0.5, "memory_limit": "2GiB",
             "link": {"rate": "100Mbit/s"}, "clock_offset_s": SKEW_S},
        ],
    }))
    return path


def _greedy_through_openai(state) -> list[str]:
    # The API serves https on the fabric address with the orchestrator's fleet certificate.
    assert state.api.startswith("https://") and state.api_ca
    api = state.api

    async def main():
        client = openai.AsyncOpenAI(base_url=api, api_key="none", max_retries=0, timeout=300,
                                    http_client=openai.DefaultAsyncHttpxClient(verify=state.api_ssl_context()))
        replies = await asyncio.gather(*(client.completions.create(
            model="fornax", prompt=p, max_tokens=12, temperature=0) for p in PROMPTS))
        return [r.choices[0].text for r in replies]

    return asyncio.run(main())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def reference(checkpoint) -> list[str]:
    tokenizer = TextContext.from_checkpoint(checkpoint).tokenizer
    return [tokenizer.decode(ids) for ids in reference_greedy(checkpoint, [list(p) for p in PROMPTS])]


def _capabilities(address: str, state_dir):
    from fornax.stage_worker.v1 import stage_worker_pb2 as sw_pb
    from fornax.stage_worker.v1 import stage_worker_pb2_grpc as sw_grpc
    from libs.security.cli_credentials import cli_channel
    from libs.service.channels import open_channel

    with open_channel(address, cli_channel(state_dir, env={})) as channel:
        return sw_grpc.StageWorkerServiceStub(channel).GetCapabilities(sw_pb.GetCapabilitiesRequest(), timeout=30)


def _pid_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def _cgroup_of(pid: int, controller: str) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(",") or controllers == "":
            return path
    return ""


def test_two_unlike_hosts_serve_greedy_text_and_leave_nothing(tmp_path, checkpoint, reference):
    fleet_file = _two_hosts(tmp_path / "two.yaml")
    up = _fornax("up", "--fleet", str(fleet_file), "--checkpoint", str(checkpoint), cwd=tmp_path)
    record = read_record(tmp_path / ".fornax")
    try:
        assert up.returncode == 0, up.stderr
        state = read_fleet(tmp_path / ".fornax")
        control, worker0, worker1 = (state.entry(n) for n in ("orchestrator", "stage_worker_0", "stage_worker_1"))
        # Each host is its own namespace and cgroup, at its own 198.18.0.0/15 address.
        assert _pid_namespace(control.pid) == _pid_namespace(worker0.pid) != _pid_namespace(worker1.pid)
        assert _pid_namespace(worker1.pid) != os.readlink("/proc/self/ns/net")
        assert worker1.grpc.startswith("198.1") and worker0.grpc.split(":")[0] != worker1.grpc.split(":")[0]
        assert _cgroup_of(worker1.pid, "cpu").endswith("/beta") and _cgroup_of(worker0.pid, "cpu").endswith("/alpha")
        # The skewed host's monotonic clock really runs SKEW_S ahead.
        offsets = {line.split()[0]: int(line.split()[1])
                   for line in Path(f"/proc/{worker1.pid}/timens_offsets").read_text().splitlines()}
        assert offsets["monotonic"] == SKEW_S
        caps = _capabilities(worker1.grpc, tmp_path / ".fornax")
        assert (caps.device.cpu_quota_cores, caps.device.memory_limit_bytes) == (0.5, 2 << 30)
        assert caps.data_plane_host == worker1.grpc.split(":")[0] and caps.device.cpuset
        assert _greedy_through_openai(state) == reference
        _assert_private_state(tmp_path / ".fornax", {"alpha": "stage_worker_0", "beta": "stage_worker_1"})
    finally:
        down = _fornax("down", cwd=tmp_path, timeout=120)
    assert down.returncode == 0, down.stderr
    assert record is not None and leftovers(record) == []


def _assert_private_state(state_dir: Path, workers: dict[str, str]) -> None:
    """Each worker loaded from its own fetched copy; the builder's store is its own."""
    hosts = state_dir / "hosts"
    built = {p.name for p in (hosts / "alpha" / "artifact_builder" / "artifacts").glob("sha256-*")}
    fetched = [{p.name for p in (hosts / h / w / "artifact_cache" / "artifacts").glob("sha256-*")}
               for h, w in workers.items()]
    assert all(len(f) == 1 for f in fetched) and set().union(*fetched) <= built
    assert len(set().union(*fetched)) == len(workers)  # one stage artifact per worker
    assert any((hosts / "alpha" / "orchestrator" / "models").glob("*/tokenizer.json"))
    assert not (state_dir.parent / ".fornax" / "artifacts").exists()


def test_three_hosts_with_unequal_quotas_serve(tmp_path, checkpoint, reference):
    up = _fornax("up", "--fleet", str(REPO / "fleets" / "three-hosts.yaml"), "--checkpoint", str(checkpoint),
                 cwd=tmp_path)
    record = read_record(tmp_path / ".fornax")
    try:
        assert up.returncode == 0, up.stderr
        state = read_fleet(tmp_path / ".fornax")
        workers = [state.entry(f"stage_worker_{i}") for i in range(3)]
        assert len({_pid_namespace(w.pid) for w in workers}) == 3
        # gamma declares a 2 ms link delay: its worker listens on loopback behind a relay.
        gamma = next(d for d in record.cgroup_dirs if d.endswith("/gamma"))
        commands = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in cgroup_pids(gamma)]
        assert any(b"apps.fleet.relay" in c for c in commands)
        assert _greedy_through_openai(state) == reference
    finally:
        down = _fornax("down", cwd=tmp_path, timeout=120)
    assert down.returncode == 0, down.stderr
    assert record is not None and leftovers(record) == []


# Each user message is long enough (tiny's byte-level BPE: well over one 16-token block) that
# every turn adds whole blocks to the conversation's reusable prefix.
CHAT_TURNS = (
    "Tell me about the river that runs past the old mill, and the bridge beside it.",
    "Now describe the road from the mill up to the village on the hill, stone by stone.",
    "What does the baker in that village sell on market days, and who buys it first?",
    "Finally, tell me how the evening ends when the lamps are lit along the harbour wall.",
)


def _chat_through_openai(state, *, reuse: bool) -> list[tuple[str, int, int]]:
    """One greedy conversation, each turn appending the assistant's reply: (text, prompt
    tokens, cached tokens) per turn. Without reuse every turn sends a fresh cache_salt, so no
    turn can match a block another request published."""
    api, conversation_salt = state.api, f"chat-{uuid.uuid4()}"

    async def main():
        client = openai.AsyncOpenAI(base_url=api, api_key="none", max_retries=0, timeout=300,
                                    http_client=openai.DefaultAsyncHttpxClient(verify=state.api_ssl_context()))
        messages: list[dict] = []
        turns = []
        for content in CHAT_TURNS:
            messages.append({"role": "user", "content": content})
            salt = conversation_salt if reuse else f"fresh-{uuid.uuid4()}"
            reply = await client.chat.completions.create(
                model="fornax", messages=messages, max_tokens=8, temperature=0,
                extra_body={"cache_salt": salt, "ignore_eos": True})
            text = reply.choices[0].message.content or ""
            details = reply.usage.prompt_tokens_details
            turns.append((text, reply.usage.prompt_tokens, details.cached_tokens if details else 0))
            messages.append({"role": "assistant", "content": text})
        return turns

    return asyncio.run(main())


def test_multi_turn_chat_reuses_earlier_turns_with_the_same_text(tmp_path, checkpoint):
    fleet_file = _two_hosts(tmp_path / "two.yaml")
    up = _fornax("up", "--fleet", str(fleet_file), "--checkpoint", str(checkpoint), cwd=tmp_path)
    record = read_record(tmp_path / ".fornax")
    try:
        assert up.returncode == 0, up.stderr
        state = read_fleet(tmp_path / ".fornax")
        assert state.api.startswith("https://") and state.api_ca
        cached_run = _chat_through_openai(state, reuse=True)
        uncached_run = _chat_through_openai(state, reuse=False)
    finally:
        down = _fornax("down", cwd=tmp_path, timeout=120)
    assert down.returncode == 0, down.stderr
    assert record is not None and leftovers(record) == []
    assert [t[0] for t in cached_run] == [t[0] for t in uncached_run]
    assert [t[1] for t in cached_run] == [t[1] for t in uncached_run]
    assert [t[2] for t in uncached_run] == [0] * len(CHAT_TURNS)
    cached = [t[2] for t in cached_run]
    assert cached[0] == 0 and all(a < b for a, b in itertools.pairwise(cached)), cached
    # Reuse is whole blocks of what the stages hold, and never the whole prompt.
    assert all(c % 16 == 0 and c < p for _, p, c in cached_run)
