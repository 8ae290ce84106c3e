"""How `fornax bench` says it could not run: one line led by the stable reason code, exit status 2."""

from apps.bench.cli import _refused
from apps.bench.fleet_serve import FleetBenchRefused
from apps.bench.llama_peer import PeerError


def test_an_error_with_a_reason_is_led_by_it(capsys):
    assert _refused(PeerError("PEER_NOT_FOUND", "no llama-server at /x")) == 2
    assert capsys.readouterr().err == "fornax bench serve: PEER_NOT_FOUND: no llama-server at /x\n"


def test_a_message_that_already_starts_with_its_reason_is_not_repeated(capsys):
    assert _refused(FleetBenchRefused("NO_MAX_HOST", "the fleet has none"), "serve") == 2
    assert capsys.readouterr().err == "fornax bench serve: NO_MAX_HOST: the fleet has none\n"


def test_a_plain_error_names_the_bench(capsys):
    assert _refused(ValueError("BAD_CONCURRENCY: --concurrency takes integers"), "placement") == 2
    assert capsys.readouterr().err == "fornax bench placement: BAD_CONCURRENCY: --concurrency takes integers\n"
