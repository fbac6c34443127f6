"""RL as isolated roles on Ray: rollout engines, reward scoring, and the DeepSpeed trainer
that drives each step, with a journal of every step (docs/rl_roles.md)."""
