"""CPU assignment of a one-box fleet: disjoint where the CPUs allow, a shared CPU stated."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from apps.fleet.cpu_shares import assign_cpus


def _overlaps(shares) -> set[tuple[str, str]]:
    return {(a.host, b.host) for a in shares for b in shares
            if a.host < b.host and set(a.cpuset) & set(b.cpuset)}


def test_enough_cpus_give_disjoint_blocks_of_ceil_cores():
    shares = assign_cpus([("a", 1.5), ("b", 0.5), ("c", 2)], (0, 1, 2, 3, 4))
    assert [s.cpuset for s in shares] == [(0, 1), (2,), (3, 4)]
    assert [s.usable_cores for s in shares] == [1.5, 0.5, 2]
    assert not any(s.shared_cpus for s in shares)


def test_a_fraction_that_would_share_is_dropped_by_a_host_with_whole_cpus():
    alpha, beta = assign_cpus([("alpha", 1.5), ("beta", 0.5)], (0, 1))
    assert (alpha.cpuset, alpha.usable_cores, alpha.threads) == ((0,), 1.0, 1)
    assert (beta.cpuset, beta.usable_cores, beta.threads) == ((1,), 0.5, 1)
    assert not alpha.shared_cpus and not beta.shared_cpus


def test_two_fractions_pack_onto_one_free_cpu_and_say_they_share_it():
    a, b, c = assign_cpus([("a", 1), ("b", 0.5), ("c", 0.5)], (0, 1))
    assert (a.cpuset, b.cpuset, c.cpuset) == ((0,), (1,), (1,))
    assert (b.shared_with, c.shared_with, a.shared_with) == (("c",), ("b",), ())
    assert "SHARES CPU 1 with c" in b.describe()


def test_a_box_too_small_for_whole_cpus_shares_round_robin_and_says_so():
    a, b = assign_cpus([("a", 2), ("b", 2)], (0, 1))
    assert a.shared_with == ("b",) and b.shared_with == ("a",)
    assert a.shared_cpus == (0, 1)


@given(st.lists(st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, 3.0]), min_size=1, max_size=5),
       st.integers(min_value=1, max_value=8))
def test_overlap_only_where_stated_and_never_where_the_box_has_the_cpus(cores, cpu_count):
    hosts = [(f"h{i}", c) for i, c in enumerate(cores)]
    shares = assign_cpus(hosts, tuple(range(cpu_count)))
    stated = {(s.host, o) for s in shares for o in s.shared_with if s.host < o}
    assert _overlaps(shares) == stated
    if sum(max(1, -(-c // 1)) for c in cores) <= cpu_count:
        assert not stated
    for s in shares:
        assert s.cpuset and s.usable_cores <= len(s.cpuset) and s.usable_cores <= s.declared_cores
        assert 1 <= s.threads <= len(s.cpuset)
