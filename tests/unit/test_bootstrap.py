"""bench.bootstrap: the interval printed beside an every-step throughput ratio."""
import pytest

from bench.bootstrap import ratio_interval


def test_the_interval_holds_the_ratio_of_the_sums_and_is_the_same_every_time():
    without = [3.0, 3.4, 2.9, 3.8, 3.1, 3.3]
    with_saves = [3.2, 3.5, 3.3, 3.9, 3.0, 3.6]
    low, high = ratio_interval(without, with_saves)
    assert low < sum(without) / sum(with_saves) < high
    assert ratio_interval(without, with_saves) == [low, high]


def test_rounds_that_agree_give_a_point_and_rounds_that_spread_a_wider_interval():
    assert ratio_interval([2.0] * 5, [2.5] * 5) == [0.8, 0.8]
    steady = ratio_interval([3.0, 3.0, 3.0, 3.0], [3.1, 3.2, 3.1, 3.2])
    noisy = ratio_interval([3.0, 3.0, 3.0, 3.0], [2.4, 3.9, 2.6, 3.8])
    assert noisy[1] - noisy[0] > steady[1] - steady[0]


def test_unpaired_rounds_are_refused():
    with pytest.raises(ValueError, match="paired rounds"):
        ratio_interval([1.0, 2.0], [1.0])
