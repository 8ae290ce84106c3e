"""A release the closed data plane could not carry goes in band once the channel reopens."""

import asyncio
import uuid

import pytest

from libs.fnx2.admission import EXT_INBAND_ADMISSION
from libs.fnx2.control import AckRelease
from libs.service.errors import Unavailable
from services.orchestrator.route.stage_chain import Route, RoutePlan, RouteStage


class FakeClient:
    extensions = frozenset({EXT_INBAND_ADMISSION})

    def __init__(self):
        self.released: list[str] = []

    async def release(self, request_id, lease_id, expected_final_epoch=None):
        self.released.append(request_id)
        return AckRelease(request_id, lease_id, True, 3, 0, True, (3, 3))

    async def close(self):
        pass


def test_a_release_on_a_closed_route_is_sent_when_it_reopens():
    plan = RoutePlan(str(uuid.uuid4()), "sha256:" + "0" * 64, str(uuid.uuid4()),
                     (RouteStage(0, "127.0.0.1:1", "127.0.0.1:2", "sha256:" + "1" * 64),))

    async def scenario():
        route = Route(plan)
        rid = str(uuid.uuid4())
        with pytest.raises(Unavailable):
            await route.release(rid)  # the data plane is closed
        client = FakeClient()
        route._client = client  # type: ignore[assignment]
        await route._flush_unsent_releases()
        await route._flush_unsent_releases()  # sent once: nothing is left to send
        await route.close()
        return rid, client.released

    rid, released = asyncio.run(scenario())
    assert released == [rid]
