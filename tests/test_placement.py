"""ROMA's two placements of replicas (Section 2.2), as pure decisions."""

import pytest

from schedulers.placement import place

WORKERS = ["w1", "w2", "w3"]
ALL = {w: {"a", "b", "c"} for w in WORKERS}


def test_balance_spreads_replicas_over_the_workers_holding_fewest():
    placed = place({"a": 2, "b": 2, "c": 2}, WORKERS, ALL, policy="balance")
    assert placed == {"a": ["w1", "w2"], "b": ["w1", "w3"], "c": ["w2", "w3"]}
    per_worker = [sum(w in ws for ws in placed.values()) for w in WORKERS]
    assert per_worker == [2, 2, 2]


def test_pack_fills_one_worker_before_the_next():
    placed = place({"a": 1, "b": 1, "c": 2}, WORKERS, ALL, policy="pack")
    assert placed == {"a": ["w1"], "b": ["w1"], "c": ["w1", "w2"]}


def test_one_replica_per_worker_and_none_where_the_model_is_not_held():
    holds = {"w1": {"a"}, "w2": {"b"}, "w3": {"a"}}
    placed = place({"a": 5, "b": None}, WORKERS, holds)
    assert placed == {"a": ["w1", "w3"], "b": ["w2"]}


def test_default_is_every_worker_that_holds_the_model():
    assert place({"a": None}, WORKERS, ALL) == {"a": WORKERS}


def test_replicas_stay_where_they_are_when_a_worker_comes_back():
    current = {"a": ["w2", "w3"]}
    # w1 was down and is back: nothing moves to it (a move would reset the replica's controller).
    assert place({"a": 2}, WORKERS, ALL, current) == {"a": ["w2", "w3"]}


def test_balance_gives_a_worker_that_joined_late_its_share():
    """Two workers found at once say hello some milliseconds apart: the first to be up held
    every replica, and the second got none for good."""
    wanted, holds = {"a": 1, "b": 1, "c": 1, "d": 1}, {"w1": {"a", "b", "c", "d"}, "w2": {"a", "b", "c", "d"}}
    first = place(wanted, ["w1"], holds)
    assert first == {"a": ["w1"], "b": ["w1"], "c": ["w1"], "d": ["w1"]}
    assert place(wanted, ["w1", "w2"], holds, first) == {"a": ["w1"], "b": ["w1"], "c": ["w2"], "d": ["w2"]}
    # pack leaves them where they are
    assert place({"a": 1, "b": 1}, ["w1", "w2"], ALL, {"a": ["w1"], "b": ["w1"]}, policy="pack") == {"a": ["w1"], "b": ["w1"]}


def test_a_lost_worker_s_replica_moves_to_another():
    current = {"a": ["w1", "w2"]}
    assert place({"a": 2}, ["w2", "w3"], ALL, current) == {"a": ["w2", "w3"]}


def test_lowering_the_count_unloads_the_fullest_worker_under_balance():
    current = {"a": ["w1", "w2"], "b": ["w1"]}
    assert place({"a": 1, "b": 1}, WORKERS, ALL, current, policy="balance") == {"a": ["w2"], "b": ["w1"]}


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="balance, pack"):
        place({"a": 1}, WORKERS, ALL, policy="spread")
