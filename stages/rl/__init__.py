"""The RL stage: the GRPO objective (`objective`), the trainer's step (`steps`), the roles on
Ray that serve it (rollout engines, reward scoring, the environment: `launcher`, `actors`,
`client`, `cluster`), the journal of every step and its replay (`replay`, `journal_view`),
and the rollout/trainer log-prob mismatch (`logprobs`, `mismatch`). docs/rl.md."""
