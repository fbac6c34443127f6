"""A warm process takes a launch only with the launch's import-time settings: every
variable is in the fingerprint but those read at run time and new for every launch."""
from __future__ import annotations

from stages import fork_server
from stages.lifeline import ENV_CHAIN, ENV_NONCE

BASE = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def _key(env: dict, cwd: str = "/repo") -> str:
    return fork_server._key(fork_server.fingerprint(env, cwd))


def test_per_launch_variables_do_not_change_the_fingerprint():
    per_launch = {ENV_CHAIN: "1:2,3:4", ENV_NONCE: "ab" * 16, "TORCHELASTIC_ERROR_FILE": "/e.json",
                  "PYTEST_CURRENT_TEST": "t.py::x (call)", fork_server.ENV: "/s/control.sock",
                  "BATON_RAY_NAMESPACE": "baton-rl-1", "BATON_TRAINER_ATTEMPT": "1"}
    assert _key({**BASE, **per_launch}) == _key(BASE)


def test_import_time_settings_and_the_directory_change_it():
    keys = {_key(BASE), _key({**BASE, "MKL_CBWR": "AVX2"}), _key({**BASE, "OMP_NUM_THREADS": "2"}),
            _key({**BASE, "SOME_NEW_VARIABLE": "x"}), _key(BASE, cwd="/elsewhere")}
    assert len(keys) == 5


def test_what_the_warm_image_sets_itself_and_ray_variables_do_not_change_it():
    after_deepspeed = {**BASE, **fork_server.IMPORT_DEFAULTS}
    after_ray = {**BASE, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONBREAKPOINT": "0"}
    assert _key(after_deepspeed) == _key(after_ray) == _key(BASE)
