"""The numerics probe: each operation a stage computes, run on fixed inputs and hashed.

Two CPUs that give different checkpoints in the same `repro.mode` differ in at least one
kernel; running this battery on both and comparing the digests operation by operation
names it (`baton probe --compare`). The battery follows what a training step does: the
model's GEMMs at its own shapes (forward and both backward products), attention, the
elementwise and reduction kernels of a Llama block, the loss, the optimizer step, the
all-reduce of two ranks, the sampler's random numbers, and one whole forward and backward
pass of the built-in model as a net for anything the list misses.

Inputs come from integer arithmetic in float64 (exact on every CPU), never from torch's
random generator, so a differing generator shows up as its own line, not as every line.
"""
from __future__ import annotations

import hashlib
import multiprocessing
from collections.abc import Callable

from core.config.schema import BatonConfig
from core.loopback import free_port

PROBE_VERSION = 2  # 2: sqrt (MKL's vector math rounds it differently by CPU vendor)
_GOLDEN_RATIO = 0.6180339887498949


def fixed_values(shape: tuple, salt: int):
    """Values in [-1, 1) from a low-discrepancy sequence: the same bits on any CPU."""
    import torch

    count = 1
    for size in shape:
        count *= size
    index = torch.arange(count, dtype=torch.float64) + salt * 7919
    return ((index * _GOLDEN_RATIO).frac() * 2 - 1).to(torch.float32).reshape(shape)


def digest(*tensors) -> str:
    hasher = hashlib.sha256()
    for tensor in tensors:
        hasher.update(tensor.detach().contiguous().numpy().tobytes())
    return hasher.hexdigest()[:16]


def run(cfg: BatonConfig) -> dict[str, str]:
    """Every operation's digest, in battery order. Call it in a process pinned to
    `cfg.repro` (core.repro.pin_this_process)."""
    found = {name: operation() for name, operation in battery(cfg)}
    found["all_reduce gloo sum, world size 2"] = _all_reduce_digest()
    return found


def battery(cfg: BatonConfig) -> list[tuple[str, Callable[[], str]]]:
    import torch
    import torch.nn.functional as F

    from stages.tokenizer import CHARACTERS, SPECIAL_TOKENS

    model = cfg.model
    tokens = cfg.stage.micro_batch * cfg.stage.seq_len
    head_dim = model.hidden_size // model.num_attention_heads
    vocab = len(SPECIAL_TOKENS) + len(CHARACTERS)
    operations = []
    # The model's linear layers at its own shapes: q/o, k/v, gate/up, down, lm_head.
    kv = model.num_key_value_heads * head_dim
    for label, (inner, outer) in {"q/o proj": (model.hidden_size, model.hidden_size),
                                  "k/v proj": (model.hidden_size, kv),
                                  "gate/up proj": (model.hidden_size, model.intermediate_size),
                                  "down proj": (model.intermediate_size, model.hidden_size),
                                  "lm_head": (model.hidden_size, vocab)}.items():
        operations += _linear(f"{label} {tokens}x{inner}->{outer}", tokens, inner, outer)
    operations += _linear("square 512x512->512", 512, 512, 512)

    batch, seq = cfg.stage.micro_batch, cfg.stage.seq_len
    q = fixed_values((batch, model.num_attention_heads, seq, head_dim), 11)
    k = fixed_values((batch, model.num_attention_heads, seq, head_dim), 12)
    v = fixed_values((batch, model.num_attention_heads, seq, head_dim), 13)
    operations.append(("sdpa causal forward+backward", lambda: _with_grads(
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, k, v)))
    x = fixed_values((tokens, model.hidden_size), 14) * 3
    weight = fixed_values((model.hidden_size,), 15) + 1
    operations += [
        ("softmax forward+backward", lambda: _with_grads(lambda a: a.softmax(-1), x)),
        ("rmsnorm forward+backward", lambda: _with_grads(
            lambda a, w: w * (a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6)), x, weight)),
        ("silu*mul forward+backward", lambda: _with_grads(lambda a, b: F.silu(a) * b, x, x.flip(0))),
        # The optimizer's and the gradient norm's square roots (core.mkl_preload).
        ("sqrt", lambda: digest(x.abs().sqrt(), x.abs().pow(0.5))),
        ("exp", lambda: digest(x.exp())), ("log", lambda: digest((x.abs() + 1e-3).log())),
        ("rotary cos/sin", lambda: digest(*_rotary(seq, head_dim))),
        ("cross_entropy forward+backward", lambda: _with_grads(
            lambda logits: F.cross_entropy(logits, torch.arange(tokens) % vocab),
            fixed_values((tokens, vocab), 16) * 4)),
        ("embedding backward", lambda: _with_grads(
            lambda table: F.embedding(torch.arange(tokens) * 7 % vocab, table),
            fixed_values((vocab, model.hidden_size), 17))),
        ("sum of 1M", lambda: digest(fixed_values((1 << 20,), 18).sum())),
        ("gradient norm", lambda: digest(torch.nn.utils.get_total_norm(
            [fixed_values((tokens, model.hidden_size), 19), fixed_values((vocab,), 20)]))),
        ("adamw step, single-tensor", lambda: _adamw_digest(foreach=False)),
        ("adamw step, foreach", lambda: _adamw_digest(foreach=True)),
        ("rng: randn, rand, randperm, multinomial", _rng_digest),
        ("tiny llama forward+backward", lambda: _model_digest(cfg, vocab)),
    ]
    return operations


def _linear(label: str, rows: int, inner: int, outer: int):
    import torch.nn.functional as F

    x = fixed_values((rows, inner), inner + outer)
    w = fixed_values((outer, inner), inner * outer) * (inner ** -0.5)

    def forward_and_grads():
        x_, w_ = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = F.linear(x_, w_)
        out.backward(fixed_values(tuple(out.shape), rows))
        return out, x_.grad, w_.grad

    return [(f"linear {label} forward", lambda: digest(forward_and_grads()[0])),
            (f"linear {label} grad input", lambda: digest(forward_and_grads()[1])),
            (f"linear {label} grad weight", lambda: digest(forward_and_grads()[2]))]


def _with_grads(function, *inputs) -> str:
    leaves = [tensor.clone().requires_grad_() for tensor in inputs]
    out = function(*leaves)
    out.backward(fixed_values(tuple(out.shape), 99) if out.dim() else None)
    return digest(out, *(leaf.grad for leaf in leaves))


def _rotary(seq: int, head_dim: int):
    import torch

    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def _adamw_digest(foreach: bool) -> str:
    import torch

    params = [torch.nn.Parameter(fixed_values((256, 128), 21)), torch.nn.Parameter(fixed_values((53,), 22))]
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=foreach)
    for step in range(3):
        for index, param in enumerate(params):
            param.grad = fixed_values(tuple(param.shape), 30 + step * 2 + index)
        optimizer.step()
    return digest(*params)


def _rng_digest() -> str:
    import torch

    generator = torch.Generator().manual_seed(1234)
    probs = fixed_values((8, 53), 23).abs() + 0.01
    return digest(torch.randn(4096, generator=generator), torch.rand(4096, generator=generator),
                  torch.randperm(4096, generator=generator).float(),
                  torch.multinomial(probs, 4, generator=generator).float())


def _model_digest(cfg: BatonConfig, vocab: int) -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = cfg.model
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # weights from fixed values, not from the generator
        for salt, param in enumerate(model.parameters()):
            param.copy_(fixed_values(tuple(param.shape), 100 + salt) * 0.05)
    ids = (torch.arange(cfg.stage.micro_batch * cfg.stage.seq_len) * 5 % vocab).reshape(
        cfg.stage.micro_batch, cfg.stage.seq_len)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return digest(out.logits, *(param.grad for param in model.parameters()))


def _all_reduce_digest() -> str:
    """Two ranks forked from this process sum a tensor over gloo on loopback."""
    context = multiprocessing.get_context("fork")
    port = free_port()
    results = context.Queue()
    ranks = [context.Process(target=_all_reduce_rank, args=(rank, port, results)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    try:
        found = _first_result(results, ranks)
    finally:
        for process in ranks:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
    return found


def _first_result(results, ranks) -> str:
    import queue

    while True:
        try:
            return results.get(timeout=0.5)
        except queue.Empty:
            failed = [p.exitcode for p in ranks if p.exitcode not in (None, 0)]
            if failed or all(p.exitcode is not None for p in ranks) and results.empty():
                raise RuntimeError(f"the probe's all-reduce ranks exited with {failed or 0} "
                                   "before rank 0 reported its result") from None


def _all_reduce_rank(rank: int, port: int, results) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        tensor = fixed_values((1 << 16,), 40 + rank)
        dist.all_reduce(tensor)
        if rank == 0:
            results.put(digest(tensor))
    finally:
        dist.destroy_process_group()


def differing(recorded: dict[str, str], found: dict[str, str]) -> list[str]:
    """The operations whose digests differ, or that one side lacks, in battery order."""
    names = list(found) + [name for name in recorded if name not in found]
    return [name for name in names if recorded.get(name) != found.get(name)]
