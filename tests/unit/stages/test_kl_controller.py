"""The KL coefficient controller: fixed, adaptive, and its state round-trip."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from stages.errors import KlStateMismatch
from stages.kl_controller import AdaptiveKL, FixedKL, build_kl_controller


def _cfg(**kw):
    return SimpleNamespace(**{"kl_coef": 0.1, "kl_target": None, "kl_horizon": 10, **kw})


def test_a_null_target_keeps_the_coefficient_fixed():
    ctl = build_kl_controller(_cfg())
    assert isinstance(ctl, FixedKL) and not isinstance(ctl, AdaptiveKL)
    ctl.update(5.0)
    assert ctl.coef == 0.1


def test_adaptive_coefficient_grows_above_target_and_shrinks_below_it():
    ctl = build_kl_controller(_cfg(kl_target=0.01))
    ctl.update(0.011)  # error 0.1 -> coef * (1 + 0.1 / 10)
    assert math.isclose(ctl.coef, 0.1 * 1.01)
    ctl.update(0.0)  # error clipped to -0.2
    assert math.isclose(ctl.coef, 0.1 * 1.01 * 0.98)


def test_one_huge_kl_moves_the_coefficient_by_the_clipped_error_only():
    ctl = AdaptiveKL(0.1, target=0.01, horizon=10)
    ctl.update(100.0)
    assert math.isclose(ctl.coef, 0.1 * 1.02)


def test_state_round_trips_and_a_different_kind_is_refused():
    ctl = AdaptiveKL(0.1, target=0.01, horizon=10)
    ctl.update(0.05)
    fresh = AdaptiveKL(0.5, target=0.5, horizon=1)
    fresh.load_state_dict(ctl.state_dict())
    assert fresh.state_dict() == ctl.state_dict()
    with pytest.raises(KlStateMismatch, match="keep stage.kl_target as it was"):
        FixedKL(0.1).load_state_dict(ctl.state_dict())
