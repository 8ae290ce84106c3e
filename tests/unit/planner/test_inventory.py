from pathlib import Path

import pytest

from services.planner.inventory import (
    InventoryError,
    Target,
    load_inventory_file,
    parse_inventory,
    parse_quantity,
    parse_target,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "services" / "planner" / "examples"


def _node(**over):
    raw = {"name": "a", "backend": "max", "memory": "8GiB", "compute": "10TFLOP/s",
           "memory_bandwidth": "100GB/s", "dtypes": ["bf16"], "operations": ["rmsnorm"]}
    raw.update(over)
    return raw


@pytest.mark.parametrize("text,kind,value", [
    ("80GiB", "bytes", 80 * 2**30), ("1.5TB", "bytes", 1.5e12), (4096, "bytes", 4096),
    ("400TFLOP/s", "flops", 400e12), ("25Gbit/s", "rate", 25e9 / 8), ("3.35TB/s", "rate", 3.35e12),
    ("50us", "time_ns", 50_000), ("1e3", "time_ns", 1000),
])
def test_quantities_with_units(text, kind, value):
    assert parse_quantity(text, kind, "x") == pytest.approx(value)


def test_bad_input_names_the_field():
    with pytest.raises(InventoryError) as err:
        parse_inventory({"nodes": [_node(), _node(name="b", memory="8 parsecs")]})
    assert err.value.field == "nodes[1].memory"
    with pytest.raises(InventoryError) as err:
        parse_inventory({"nodes": [_node(backend="cuda")]})
    assert err.value.field == "nodes[0].backend"
    with pytest.raises(InventoryError) as err:
        parse_inventory({"nodes": [_node()], "links": [{"between": ["a", "zz"], "bandwidth": 1}]})
    assert err.value.field == "links[0]"
    with pytest.raises(InventoryError) as err:
        parse_target({"min_stages": 3, "max_stages": 2})
    assert err.value.field == "target.min_stages"
    with pytest.raises(InventoryError) as err:
        parse_target({"context_tokens": 0})
    assert err.value.field == "target.context_tokens"
    with pytest.raises(InventoryError):
        parse_inventory({"nodes": [_node(), _node()]})  # duplicate names
    with pytest.raises(InventoryError) as err:
        parse_inventory({"nodes": [_node(reserv="4GiB")]})  # a typo is not silently ignored
    assert err.value.field == "nodes[0].reserv"
    assert parse_inventory({"x-note": "free", "nodes": [_node(**{"x-rack": 3})]}).nodes[0].name == "a"


def test_links_are_symmetric_unless_the_reverse_is_given():
    inv = parse_inventory({
        "nodes": [_node(name="a"), _node(name="b")],
        "links": [{"between": ["a", "b"], "bandwidth": "1GB/s", "latency": "1ms"},
                  {"from": "b", "to": "a", "bandwidth": "2GB/s"}],
    })
    assert inv.link("a", "b").bandwidth_bytes_per_s == 1e9
    assert inv.link("b", "a").bandwidth_bytes_per_s == 2e9
    assert inv.link("a", "a") is None


def test_default_microbatch_rows_keep_the_pipeline_full():
    assert Target(concurrency=30, max_stages=4).microbatch_rows == 4  # 8 microbatches >= 2*4-1
    assert Target(concurrency=1, max_stages=4).microbatch_rows == 1
    assert Target(concurrency=30, decode_microbatch_rows=3).microbatch_rows == 3


@pytest.mark.parametrize("name", ["mixed_fleet.yaml", "deployment_fleet.yaml"])
def test_shipped_examples_parse(name):
    loaded = load_inventory_file(EXAMPLES / name)
    assert len(loaded.inventory.nodes) >= 2
    assert loaded.target.mode in ("exploratory", "deployment")
    assert load_inventory_file(EXAMPLES / name, mode="exploratory").target.mode == "exploratory"


def test_deployment_example_references_evidence():
    inv = load_inventory_file(EXAMPLES / "deployment_fleet.yaml").inventory
    assert inv.model_evidence[0].record_type == "model"
    assert {r.record_type for r in inv.nodes[0].evidence} == {"capability", "measurement"}
    assert inv.links[0].evidence[0].record_type == "route"
