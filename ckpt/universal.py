"""DeepSpeed universal checkpoints: convert a verified baton checkpoint into one, read it back.

Layout (DeepSpeed's): `<tag>/mp_rank_00_model_states.pt` (scheduler, counters) and
`<tag>/zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt` holding `{"param": full tensor}`, plus
`step.pt` and `zero/optimizer_state.pt` (global optimizer state). ZeRO 1-3 sources go
through `deepspeed.checkpoint.ds_to_universal`; a ZeRO-0 source has no optimizer shard
files for it to read, so the same layout is written here from the full state in
`mp_rank_00_model_states.pt`. Every load is weights_only (ckpt.safe_load), DeepSpeed's
included.
"""
from __future__ import annotations

import contextlib
import io
import shutil
from argparse import Namespace
from pathlib import Path

import torch

from ckpt import manifest as manifest_io
from ckpt import safe_load
from ckpt.errors import CorruptCheckpoint
from ckpt.reader import CheckpointReader, pickle_files, private_copy

CONVERTER = "deepspeed.checkpoint.ds_to_universal"
ZERO0_CONVERTER = "baton.ckpt.universal.zero0_to_universal"
MODEL_STATES = "mp_rank_00_model_states.pt"
ZERO3_MODEL_STATES = "zero_pp_rank_0_mp_rank_00_model_states.pt"
MOMENTS = ("exp_avg", "exp_avg_sq")


def converter_name(zero_stage: int) -> str:
    return ZERO0_CONVERTER if zero_stage == 0 else CONVERTER


def load_file(path: Path):
    """A file of a universal folder this process wrote (or checked against the fingerprint
    its writer recorded): still a weights_only load, like every other."""
    return safe_load.load_file(path)


def to_universal(src: Path, out: Path, zero_stage: int, log: io.StringIO) -> Path:
    """Write the universal form of the checkpoint `src` (verified by the caller) to `out`
    (a tag folder). Every source file is read once and checked against its manifest
    (ckpt.reader); DeepSpeed's converter reads a private copy of those checked bytes,
    under a forced weights_only load."""
    reader = CheckpointReader(src)
    if zero_stage == 0:
        _zero0_to_universal(reader, out)
    else:
        from deepspeed.checkpoint import ds_to_universal

        with private_copy(reader, pickle_files(reader.manifest), under=out.parent) as copy:
            args = Namespace(input_folder=str(copy), output_folder=str(out),
                             num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False,
                             strict=True,
                             # baton is not Megatron: its model files carry no universal info
                             inject_missing_state=True)
            # The converter keeps a module-level fragment counter its dump function increments.
            ds_to_universal.cnt = 0
            with safe_load.forced_safe_load(src), contextlib.redirect_stdout(log), \
                    contextlib.redirect_stderr(log):
                ds_to_universal.main(args)
    _normalise(out)
    return out


def _zero0_to_universal(reader: CheckpointReader, out: Path) -> None:
    src = reader.directory
    states = reader.torch(MODEL_STATES)
    optim = states["optimizer"]
    buffers = set(states.get("buffer_names") or [])
    names = [n for n in states["module"] if n not in buffers]
    group = optim["param_groups"][0]
    if len(optim["param_groups"]) != 1 or len(group["params"]) != len(names):
        raise CorruptCheckpoint(src, [f"ZeRO-0 optimizer holds {len(group['params'])} parameters in "
                                      f"{len(optim['param_groups'])} groups; the model has {len(names)}"])
    zero = out / "zero"
    for index, name in zip(group["params"], names):
        state, directory = optim["state"].get(index, {}), zero / name
        directory.mkdir(parents=True, exist_ok=True)
        full = {"fp32": states["module"][name].float(), **{k: state[k] for k in MOMENTS if k in state}}
        for key, tensor in full.items():
            torch.save({"param": tensor.float().clone(), "cat_dim": 0}, directory / f"{key}.pt")
        if "step" in state:
            torch.save(torch.as_tensor(state["step"], dtype=torch.float32), directory / "step.pt")
    import deepspeed
    torch.save({"param_groups": optim["param_groups"], "ds_version": deepspeed.__version__,
                "zero_stage": 0}, zero / "optimizer_state.pt")
    # The scheduler, step counters and ds_config travel in the model-states file.
    torch.save({k: v for k, v in states.items() if k != "optimizer"} | {"optimizer": None},
               out / MODEL_STATES)


def _normalise(out: Path) -> None:
    """Make one folder loadable by every target stage: ZeRO-1/2 read `step.pt` per parameter
    and top-level `param_groups`; ZeRO-3 reads `optimizer_state_dict.state[0].step`."""
    import deepspeed

    # A universal load reads scheduler and counters from the model-states file under the
    # name the *target* stage saves: ZeRO-3 `zero_pp_rank_0_...`, otherwise `mp_rank_00_...`.
    for have, want in ((MODEL_STATES, ZERO3_MODEL_STATES), (ZERO3_MODEL_STATES, MODEL_STATES)):
        if (out / have).is_file() and not (out / want).is_file():
            shutil.copyfile(out / have, out / want)
    zero = out / "zero"
    optim_sd = load_file(zero / "optimizer_state.pt")
    inner = optim_sd.get("optimizer_state_dict") or {}
    groups = optim_sd.get("param_groups") or inner.get("param_groups")
    steps = [load_file(p) for p in sorted(zero.glob("*/step.pt"))]
    step = steps[0] if steps else next(iter(inner.get("state", {}).values()), {}).get("step")
    if step is None:
        raise CorruptCheckpoint(out, ["universal checkpoint has no optimizer step count"])
    for directory in (d for d in zero.iterdir() if d.is_dir()):
        if not (directory / "step.pt").is_file():
            torch.save(step, directory / "step.pt")
    optim_sd["param_groups"] = groups
    optim_sd.setdefault("ds_version", deepspeed.__version__)
    optim_sd["optimizer_state_dict"] = {"state": {0: {"step": step}}, "param_groups": groups}
    torch.save(optim_sd, zero / "optimizer_state.pt")


def fingerprint(folder: Path) -> dict[str, str]:
    """sha256 of every file of a universal folder, recorded by the writer."""
    return {p.relative_to(folder).as_posix(): manifest_io.sha256_file(p)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def check_fingerprint(folder: Path, expected: dict[str, str]) -> None:
    """DeepSpeed unpickles universal files itself; check them against what was written first."""
    actual = fingerprint(folder)
    problems = [f"{rel} changed since conversion" for rel in expected if actual.get(rel) != expected[rel]]
    problems += [f"unexpected file {rel}" for rel in actual if rel not in expected]
    if problems:
        raise CorruptCheckpoint(folder, problems)


def read_states(folder: Path, keys=("fp32",) + MOMENTS) -> dict[str, dict[str, torch.Tensor]]:
    """{param name: {key: full fp32 tensor}} of a universal folder."""
    found = {}
    for directory in sorted(d for d in (folder / "zero").iterdir() if d.is_dir()):
        found[directory.name] = {k: _tensor(load_file(directory / f"{k}.pt"))
                                 for k in keys if (directory / f"{k}.pt").is_file()}
    return found


def _tensor(saved) -> torch.Tensor:
    # ZeRO-1/2 conversion saves {"param": tensor, "cat_dim": ...}; ZeRO-3 the tensor itself.
    tensor = saved["param"] if isinstance(saved, dict) else saved
    return tensor.detach().float()


def universal_step(folder: Path) -> float:
    step = load_file(next((folder / "zero").glob("*/step.pt")))
    return float(step)
