import hashlib
import json
from pathlib import Path

import numpy as np

from libs.fnx2.wire.codec import decode_frame
from libs.fnx2.wire.golden import check_golden
from libs.fnx2.wire.leases import derive_execution_lease_id
from libs.fnx2.wire.messages import Batch, Phase

# The FNX2 conformance vector, vendored with the tests.
GOLDEN = Path(__file__).with_name("fnx2_golden_v2.json")


def test_golden_frame_is_byte_exact():
    check = check_golden(GOLDEN)
    assert len(check.frame) == 1292
    assert hashlib.sha256(check.frame).hexdigest() == (
        "1f4ba161723e850234198404deaae18aa0976ff321e8ce9d312ecf7cf816bb6b")
    assert check.ok


def test_golden_frame_decodes_back_to_the_fixture_batch():
    fixture = json.loads(GOLDEN.read_text())
    frame = decode_frame(check_golden(GOLDEN).frame, allow_extensions=False)
    assert frame.sequence_no == 7
    batch = frame.message
    assert isinstance(batch, Batch)
    assert batch.source_stage == "gateway" and batch.destination_stage == "stage-0"
    assert batch.batch.phase is Phase.PREFILL
    assert [s.input_row_count for s in batch.batch.sequences] == [2, 3]
    assert np.array_equal(batch.tensor.array, np.array([10, 11, 20, 21, 22], dtype=np.int32))
    assert batch.batch.to_meta() == fixture["prefill"]["batch"]


def test_lease_ids_are_derived_from_plan_generation():
    fixture = json.loads(GOLDEN.read_text())
    manifest = fixture["manifests"][0]
    for request in fixture["requests"]:
        lease = derive_execution_lease_id(fixture["plan_generation_id"], manifest["plan_id"],
                                          manifest["plan_hash"], request["request_id"])
        assert lease == request["execution_lease_id"]
    other_generation = derive_execution_lease_id(
        "88888888-8888-4888-8888-888888888888", manifest["plan_id"], manifest["plan_hash"],
        fixture["requests"][0]["request_id"])
    assert other_generation != fixture["requests"][0]["execution_lease_id"]
