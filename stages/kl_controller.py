"""KL-penalty coefficient for RL: fixed, or adaptive towards a target KL (PPO-style).

The adaptive rule is Ziegler et al.'s (2019) proportional controller: the error
kl/target - 1 is clipped to ±0.2 so one noisy step cannot swing the coefficient,
and `horizon` steps of a constant error change it by a factor of about e^error.
"""
from __future__ import annotations

from stages.errors import KlStateMismatch

KIND, COEF, TARGET, HORIZON = "kind", "coef", "target", "horizon"
FIXED, ADAPTIVE = "fixed", "adaptive"
ERROR_CLIP = 0.2


class FixedKL:
    kind = FIXED

    def __init__(self, coef: float):
        self.coef = float(coef)

    def update(self, kl: float, n_steps: int = 1) -> None:
        """A fixed coefficient ignores the measured KL."""

    def state_dict(self) -> dict:
        return {KIND: self.kind, COEF: self.coef}

    def load_state_dict(self, state: dict) -> None:
        if state[KIND] != self.kind:
            raise KlStateMismatch(state[KIND], self.kind)
        self.coef = float(state[COEF])


class AdaptiveKL(FixedKL):
    kind = ADAPTIVE

    def __init__(self, coef: float, target: float, horizon: int):
        super().__init__(coef)
        self.target, self.horizon = float(target), int(horizon)

    def update(self, kl: float, n_steps: int = 1) -> None:
        error = min(max(kl / self.target - 1.0, -ERROR_CLIP), ERROR_CLIP)
        self.coef *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {**super().state_dict(), TARGET: self.target, HORIZON: self.horizon}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.target, self.horizon = float(state[TARGET]), int(state[HORIZON])


def build_kl_controller(stage_cfg) -> FixedKL:
    """`stage.kl_target` null keeps `stage.kl_coef` fixed; a value makes it adaptive."""
    if stage_cfg.kl_target is None:
        return FixedKL(stage_cfg.kl_coef)
    return AdaptiveKL(stage_cfg.kl_coef, stage_cfg.kl_target, stage_cfg.kl_horizon)
