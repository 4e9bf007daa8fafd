"""forkd.operator.split: a pool's warm children split across nodes by their room (pure; table-tested)."""

from __future__ import annotations

import itertools

import pytest

from forkd.operator.split import NoRoom, node_room, placed_claim, split_claim, split_warm

CASES = [
    # (warm, room, current, expected)
    ("fits one node: the roomiest", 4, {"a": 10, "b": 6}, {}, {"a": 4}),
    ("fits one node: ties broken by hashing, stable", 4, {"a": 5, "b": 5}, {}, "one node"),
    ("larger than any node: split by room", 10, {"a": 6, "b": 6}, {}, {"a": 5, "b": 5}),
    ("split follows capacity", 10, {"a": 9, "b": 3, "c": 0}, {}, None),
    ("exactly the total room", 7, {"a": 3, "b": 4}, {}, {"a": 3, "b": 4}),
    ("zero warm: nothing anywhere", 0, {"a": 3}, {"a": 2}, {}),
    ("existing shares kept when growing", 6, {"a": 10, "b": 0}, {"b": 3}, {"a": 3, "b": 3}),
    ("existing shares kept while they fit", 4, {"a": 10, "b": 0}, {"a": 2, "b": 2}, {"a": 2, "b": 2}),
    ("shrinking takes from the fullest node first", 3, {"a": 0, "b": 5}, {"a": 2, "b": 2}, {"a": 1, "b": 2}),
    ("on one node, growing while it fits there: stays", 6, {"a": 4, "b": 20}, {"a": 2}, {"a": 6}),
    ("a node that left keeps nothing: refilled elsewhere", 4, {"a": 10}, {"a": 2, "gone": 2}, {"a": 4}),
]


@pytest.mark.parametrize("what,warm,room,current,expected", CASES, ids=[c[0] for c in CASES])
def test_split(what, warm, room, current, expected):
    got = split_warm(warm, room, current, key="ns/pool")
    assert sum(got.values()) == warm
    for n, v in got.items():
        assert 0 < v <= room[n] + current.get(n, 0), (n, got)
    if expected == "one node":
        assert len(got) == 1 and got == split_warm(warm, room, current, key="ns/pool")
    elif expected is None:  # proportional-ish: the node with 3x the room holds at least 2x as many
        assert got["a"] >= 2 * got["b"] and "c" not in got, got
    else:
        assert got == expected


def test_not_enough_room_names_each_node():
    with pytest.raises(NoRoom, match=r"room for 5 \(a: 2, b: 3\)"):
        split_warm(6, {"a": 2, "b": 3})


def test_negative_warm_refused():
    with pytest.raises(ValueError):
        split_warm(-1, {"a": 2})


def test_exhaustive_small_tables():
    """Every small table: the total is warm, no node over its capacity, shares kept where capacity allows."""
    for warm, ra, rb, ca, cb in itertools.product(range(5), range(4), range(4), range(3), range(3)):
        room, current = {"a": ra, "b": rb}, {"a": ca, "b": cb}
        cap = {"a": ra + ca, "b": rb + cb}
        if cap["a"] + cap["b"] < warm:
            with pytest.raises(NoRoom):
                split_warm(warm, room, current)
            continue
        got = split_warm(warm, room, current)
        assert sum(got.values()) == warm
        assert all(got.get(n, 0) <= cap[n] for n in cap), (warm, room, current, got)
        if warm >= ca + cb:  # growing or equal: nobody loses a child
            assert all(got.get(n, 0) >= current[n] for n in cap), (warm, room, current, got)


ROOM = [
    # (available MiB, per child, assigned, warm now, expected room)
    ("empty node", 1024, 128, 0, 0, 8),
    ("a share not restored yet takes its room", 1024, 128, 3, 1, 6),
    ("restored children already left available memory", 768, 128, 2, 2, 6),
    ("rounds down", 300, 128, 0, 0, 2),
    ("never negative", 100, 128, 4, 0, 0),
]


@pytest.mark.parametrize("what,avail,per,assigned,warm,expected", ROOM, ids=[c[0] for c in ROOM])
def test_node_room(what, avail, per, assigned, warm, expected):
    assert node_room(avail, per, assigned, warm) == expected


CLAIMS = [
    # (count, warm children per node, expected)
    ("one node has them all", 2, {"a": 3, "b": 1}, {"a": 2}),
    ("spills to the next node", 4, {"a": 3, "b": 2}, {"a": 3, "b": 1}),
    ("one each when one each is warm", 2, {"a": 1, "b": 1}, {"a": 1, "b": 1}),
    ("more than warm: the rest forked where most were warm", 5, {"a": 2, "b": 1}, {"a": 4, "b": 1}),
    ("nothing warm: one node forks them all", 2, {"a": 0, "b": 0}, "one node"),
]


@pytest.mark.parametrize("what,count,warm,expected", CLAIMS, ids=[c[0] for c in CLAIMS])
def test_split_claim(what, count, warm, expected):
    got = split_claim(count, warm, key="ns/claim")
    assert sum(got.values()) == count
    if expected == "one node":
        assert len(got) == 1 and got == split_claim(count, warm, key="ns/claim")
    else:
        assert got == expected


def test_split_claim_needs_a_node():
    with pytest.raises(NoRoom, match="no node holds the pool"):
        split_claim(1, {})


PLACED = [
    # (what, status children's nodes, held {node: count}, expected)
    ("held on two nodes, one has not claimed yet: both", ["a"], {"a": 1, "b": 1}, {"a": 1, "b": 1}),
    ("held, nothing claimed yet anywhere", [], {"a": 2}, {"a": 2}),
    ("a node that left keeps its children (reported lost)", ["a", "gone"], {"a": 1}, {"a": 1, "gone": 1}),
    ("a known node that lost the object: applied again", ["a", "b", "b"], {"a": 1}, {"a": 1, "b": 2}),
    ("held count wins over the children listed", ["a"], {"a": 3}, {"a": 3}),
    ("nowhere yet", [], {}, {}),
]


@pytest.mark.parametrize("what,nodes,held,expected", PLACED, ids=[c[0] for c in PLACED])
def test_placed_claim(what, nodes, held, expected):
    assert placed_claim([{"id": f"c{i}", "node": n} for i, n in enumerate(nodes)], held) == expected
