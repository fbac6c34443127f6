"""Your own data, in this process: every file format gives the same tokens, the loss falls
on the answer only, the cache is keyed by content, and each bad input is refused with a
message naming the file, row or key (stages.data)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from core.config import compose
from core.config.compose import quoted
from core.errors import ConfigError
from stages.data.chat_template import DirectTemplate
from stages.data.examples import FileExamples
from stages.data.prepare import load_tokenizer, prepare_data
from stages.data.render import IGNORE, Renderer, RowProblem
from stages.data.resume import changes
from stages.tasks import HELDOUT, TRAIN
from bench.tiny_hf_model import build_tiny_model

CHATS = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": f"{a}+{b}="},
          {"role": "assistant", "content": str(a + b)}] for a, b in [(1, 2), (30, 4), (7, 7), (12, 9)] * 5]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {family: build_tiny_model(root / family, family) for family in ("llama", "qwen2")}


def _tokenizer(model_dir: Path):
    return load_tokenizer(compose([]), model_dir)[0]


def _renderer(model_dir, fmt, **kw) -> Renderer:
    columns = {r: r for r in ("text", "prompt", "completion", "messages", "chosen", "rejected", "answer")}
    options = {"max_length": 256, "truncation": "error", "loss_on": "completion", **kw}
    return Renderer(_tokenizer(model_dir), fmt, columns, **options)


def _trained_text(tok, row: dict) -> str:
    return tok.decode([t for t, label in zip(row["input_ids"], row["labels"]) if label != IGNORE])


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_chat_loss_falls_on_the_assistant_turns_only(models, family):
    renderer = _renderer(models[family], "messages")
    conversation = CHATS[1][:3] + [{"role": "user", "content": "and 1+1="},
                                    {"role": "assistant", "content": "2"}]
    row = renderer.row({"messages": conversation})
    trained = _trained_text(renderer.tok, row)
    assert "34" in trained and "2" in trained
    assert "be brief" not in trained and "30+4" not in trained and "1+1" not in trained
    assert len(row["input_ids"]) == len(row["labels"]) == row["length"]
    everything = _renderer(models[family], "messages", loss_on="all").row({"messages": conversation})
    assert everything["labels"] == everything["input_ids"]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("loss_on", ["completion", "all"])
def test_a_batch_renders_and_fails_exactly_as_its_rows_one_by_one(models, family, loss_on):
    """`Renderer.rows` (one batched render and encoding per datasets.map batch, the template
    rendered directly, token offsets asked for around the spans only) gives `row`'s output
    for every row, characters split across tokens included, and the same problem for a bad one."""
    renderer = _renderer(models[family], "messages", loss_on=loss_on, max_length=48)
    multi_turn = CHATS[2] + [{"role": "user", "content": "and twice that?"},
                             {"role": "assistant", "content": "28, twice 14"}]
    batch = [{"messages": m} for m in (
        *CHATS[:3], multi_turn,
        [{"role": "user", "content": "é?"}, {"role": "assistant", "content": " 🎉é\n字 "}],
        [{"role": "user", "content": "no answer here"}],                      # no assistant turn
        "not a list",                                                         # malformed
        [{"role": "user", "content": "x " * 80}, {"role": "assistant", "content": "y"}],  # too long
        [{"role": "assistant", "content": "an answer first"}, {"role": "user", "content": "ok"}])]

    def one(row):
        try:
            return renderer.row(row)
        except RowProblem as problem:
            return ("problem", str(problem))
    expected = [one(row) for row in batch]
    got = [("problem", str(r)) if isinstance(r, RowProblem) else r for r in renderer.rows(batch)]
    assert got == expected
    assert sum(isinstance(r, tuple) for r in got) == (2 if loss_on == "all" else 3)


def test_a_direct_render_that_differs_from_apply_chat_template_is_switched_off(models):
    """The template rendered directly must give apply_chat_template's text; a difference
    (here a template variable it would pass otherwise) sends everything back to it."""
    tok = _tokenizer(models["llama"])
    direct = DirectTemplate(tok)
    assert direct.usable
    assert direct.render_many(CHATS[:2], generation=True) == tok.apply_chat_template(
        CHATS[:2], tokenize=False, add_generation_prompt=True)
    direct._variables = {**direct._variables, "bos_token": "<not the bos>"}
    assert direct.render_many(CHATS[:2], generation=False) == tok.apply_chat_template(CHATS[:2], tokenize=False)
    assert not direct.usable


def test_plain_prompt_completion_adds_bos_only_where_the_model_has_one(models):
    for family, has_bos in (("llama", True), ("qwen2", False)):
        renderer = _renderer(models[family], "prompt_completion")
        row = renderer.row({"prompt": "12+30=", "completion": "42"})
        tok = renderer.tok
        assert (row["input_ids"][0] == tok.bos_token_id) == has_bos
        assert row["input_ids"][-1] == tok.eos_token_id and row["labels"][-1] == tok.eos_token_id
        assert _trained_text(tok, row).strip().startswith("42")
        assert "12+30" not in _trained_text(tok, row)


def test_truncation_error_left_and_right(models):
    long = {"text": "1+1=2 " * 60}
    with pytest.raises(RowProblem, match=r"tokens, longer than data.max_length=16; raise data.max_length"):
        _renderer(models["qwen2"], "text", max_length=16).row(long)
    full = _renderer(models["qwen2"], "text", max_length=1000).row(long)["input_ids"]
    assert _renderer(models["qwen2"], "text", max_length=16, truncation="left").row(long)["input_ids"] == full[-16:]
    assert _renderer(models["qwen2"], "text", max_length=16, truncation="right").row(long)["input_ids"] == full[:16]


def _write(directory: Path, kind: str, rows: list[dict]) -> str:
    """The same rows in each format a user may bring; returns the path to configure."""
    import datasets

    directory.mkdir(parents=True, exist_ok=True)
    if kind == "jsonl":
        path = directory / "rows.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "json":
        path = directory / "rows.json"
        path.write_text(json.dumps(rows))
    elif kind == "parquet":
        path = directory / "rows.parquet"
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    elif kind == "saved":
        path = directory / "saved"
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    else:  # a glob over two JSON Lines files
        half = len(rows) // 2
        (directory / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:half]))
        (directory / "part-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[half:]))
        path = directory / "part-*.jsonl"
    return str(path)


def _config(tmp_path, model_dir, stage, path, *extra):
    return compose([f"stage={stage}", f"run.dir={tmp_path / 'run'}", f"model.path={model_dir}",
                    f"data.{stage}.train.path={path}", "data.max_length=64", *extra])


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet", "saved", "glob"])
def test_every_file_format_gives_the_same_rows(models, tmp_path, kind):
    rows = [{"question": f"{i}+1=", "response": str(i + 1)} for i in range(40)]
    path = _write(tmp_path / kind, kind, rows)
    cfg = _config(tmp_path, models["qwen2"], "sft", path, "data.sft.train.keys.prompt=question",
                  "data.sft.train.keys.completion=response", "data.sft.eval_fraction=0.1")
    plan = prepare_data(cfg, models["qwen2"])
    assert (plan["train"]["rows"], plan["eval"]["rows"]) == (36, 4)
    assert plan["train"]["keys"] == {"prompt": "question", "completion": "response"}
    examples = FileExamples(plan)
    assert examples.size(TRAIN) == 36 and examples.size(HELDOUT) == 4
    reference = _renderer(models["qwen2"], "prompt_completion", max_length=64)
    seen = {tuple(examples.lm_example(split, i)[0]) for split in (TRAIN, HELDOUT)
            for i in range(examples.size(split))}
    assert seen == {tuple(reference.row({"prompt": r["question"], "completion": r["response"]})["input_ids"])
                    for r in rows}
    some = [5, 0, 35, 5]  # a micro-batch is read in one take: the same rows, in its order
    assert examples.lm_examples(TRAIN, some) == [examples.lm_example(TRAIN, i) for i in some]


def test_the_cache_is_keyed_by_content(models, tmp_path, monkeypatch, capfd):
    path = _write(tmp_path / "d", "jsonl", [{"text": f"line {i}"} for i in range(20)])
    cfg = _config(tmp_path, models["llama"], "cpt", path, "data.cpt.eval_fraction=0.2")
    first = prepare_data(cfg, models["llama"])
    assert "tokenizing data.cpt" in capfd.readouterr().err  # the progress bar, named by its key
    import stages.data.prepare as prepare

    def no_second_tokenization(*_):
        raise AssertionError("the cache was not used")
    monkeypatch.setattr(prepare, "_tokenized", no_second_tokenization)
    assert prepare_data(cfg, models["llama"]) == first
    Path(path).write_text(Path(path).read_text() + json.dumps({"text": "one more"}) + "\n")
    monkeypatch.undo()
    changed = prepare_data(cfg, models["llama"])
    assert changed["train"]["digest"] != first["train"]["digest"]
    assert changed["train"]["cache"] != first["train"]["cache"]
    assert changes(first, changed) == [
        f"train data {path} has content {changed['train']['digest']}, the checkpoint's had "
        f"{first['train']['digest']}"]
    assert changes(first, first) == [] and changes(None, None) == []


def test_the_cache_key_covers_the_tokenizer_template_max_length_and_loss(models, tmp_path):
    """The same file tokenized another way is another cache entry, never the old tokens."""
    path = _write(tmp_path / "d", "jsonl", [{"messages": chat} for chat in CHATS])
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                        "{% if add_generation_prompt %}[assistant] {% endif %}")
    base = ("data.sft.train.format=messages", "data.sft.eval_fraction=0.2")

    def cache(model="qwen2", *extra):
        return prepare_data(_config(tmp_path, models[model], "sft", path, *base, *extra), models[model])["train"]["cache"]
    first = cache()
    assert cache() == first
    others = [cache("llama"), cache("qwen2", f"model.chat_template={template}"),
              cache("qwen2", "data.max_length=48"), cache("qwen2", "data.loss_on=all")]
    assert len({first, *others}) == 5, others


def test_preference_pairs_of_strings_and_of_messages(models, tmp_path):
    rows = [{"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i + 2)} for i in range(10)]
    chats = [{"chosen": [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["chosen"]}],
              "rejected": [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["rejected"]}]}
             for r in rows]
    for name, data in (("strings", rows), ("chats", chats)):
        cfg = _config(tmp_path / name, models["llama"], "rm", _write(tmp_path / name, "jsonl", data),
                      "data.rm.eval_fraction=0.2")
        examples = FileExamples(prepare_data(cfg, models["llama"]))
        chosen, rejected = examples.preference(TRAIN, 0)
        assert chosen != rejected and chosen[0] == rejected[0]
        assert examples.lm_examples(TRAIN, [1, 0]) == [examples.lm_example(TRAIN, i) for i in (1, 0)]


# -- bad input: one message naming the file, the row or line, the key ------------------------
def _refused(cfg, model_dir, *needles):
    with pytest.raises(ConfigError) as caught:
        prepare_data(cfg, model_dir)
    message = str(caught.value)
    for needle in needles:
        assert needle in message, message
    return message


def test_bad_inputs_are_refused_by_name(models, tmp_path):
    qwen = models["qwen2"]
    good = _write(tmp_path / "good", "jsonl", [{"prompt": "1+1=", "completion": "2"}] * 20)
    _refused(_config(tmp_path, qwen, "sft", str(tmp_path / "absent.jsonl")), qwen,
             f"data.sft.train.path='{tmp_path / 'absent.jsonl'}': no such file or directory")
    _refused(_config(tmp_path, qwen, "sft", good, "data.sft.train.format=poems"), qwen,
             "data.sft.train.format='poems': stage sft trains on prompt_completion or messages or text")
    _refused(_config(tmp_path, qwen, "sft", good, "data.sft.train.keys.completion=answer_text"), qwen,
             "no column 'answer_text' for the completion of format prompt_completion; the rows have "
             "prompt, completion", "data.sft.train.keys.completion=<column>")
    bad_line = tmp_path / "bad" / "rows.jsonl"
    bad_line.parent.mkdir()
    bad_line.write_text('{"prompt": "1+1=", "completion": "2"}\n{"prompt": "2+2=", "completion": \n')
    _refused(_config(tmp_path, qwen, "sft", str(bad_line)), qwen, f"{bad_line}:2 is not valid JSON")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    _refused(_config(tmp_path, qwen, "sft", str(empty)), qwen, "holds no rows")
    few = _write(tmp_path / "few", "jsonl", [{"prompt": "1+1=", "completion": "2"}] * 5)
    _refused(_config(tmp_path, qwen, "sft", few), qwen,
             "data.sft.eval_fraction=0.05 of 5 rows", "holds out no row")
    long = _write(tmp_path / "long", "jsonl", [{"prompt": "1+1=", "completion": "2"}] * 5
                  + [{"prompt": "1+1=" * 40, "completion": "2"}] * 15)
    _refused(_config(tmp_path, qwen, "sft", long), qwen,
             "row 6:", "longer than data.max_length=64", "data.truncation=left or right")
    typed = _write(tmp_path / "typed", "jsonl", [{"prompt": "1+1=", "completion": 2}] * 20)
    _refused(_config(tmp_path, qwen, "sft", typed), qwen, "row 1:", "'prompt'/'completion' hold str/int")


def test_rows_that_cannot_train_are_refused_by_row(models, tmp_path):
    qwen = models["qwen2"]
    rows = [{"prompt": "1+1=", "completion": "2"}] * 19 + [{"prompt": "1+1=" * 40, "completion": "2"}]
    # Truncated from the right, the last row keeps only prompt tokens: nothing to learn.
    _refused(_config(tmp_path, qwen, "sft", _write(tmp_path / "cut", "jsonl", rows), "data.truncation=right"),
             qwen, "row 20:", "no token of the answer is left within data.max_length=64")
    missing = [{"prompt": "1+1=", "completion": "2"}] * 19 + [{"completion": "2"}]
    _refused(_config(tmp_path, qwen, "sft", _write(tmp_path / "missing", "jsonl", missing)), qwen,
             "row 20:", "'prompt' is empty (null or missing)")
    strict = "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}" \
             "{% endif %}{{ m['content'] }}{% endfor %}"
    chats = _write(tmp_path / "chats", "jsonl", [{"messages": c} for c in CHATS])
    _refused(_config(tmp_path, qwen, "sft", chats, "data.sft.train.format=messages",
                     quoted("model.chat_template", strict)), qwen,
             "row 1:", "the chat template refused the conversation", "no system role")


def test_eval_keys_fall_back_to_train_keys_role_by_role(models, tmp_path):
    train = _write(tmp_path / "train", "jsonl", [{"q": f"{i}+1=", "a": str(i + 1)} for i in range(20)])
    held = _write(tmp_path / "held", "jsonl", [{"q": f"{i}+2=", "ans": str(i + 2)} for i in range(4)])
    cfg = _config(tmp_path, models["llama"], "sft", train, f"data.sft.eval.path={held}",
                  "data.sft.train.keys.prompt=q", "data.sft.train.keys.completion=a",
                  "data.sft.eval.keys.completion=ans")
    plan = prepare_data(cfg, models["llama"])
    assert plan["eval"]["keys"] == {"prompt": "q", "completion": "ans"} and plan["eval"]["rows"] == 4


def test_a_saved_dataset_keeps_its_digest_and_a_redrawn_split_is_a_change(models, tmp_path):
    path = _write(tmp_path / "d", "saved", [{"text": f"line {i}"} for i in range(20)])
    cfg = _config(tmp_path, models["llama"], "cpt", path, "data.cpt.eval_fraction=0.2")
    first = prepare_data(cfg, models["llama"])
    assert sorted(p.name for p in Path(path).iterdir()) == ["data-00000-of-00001.arrow",
                                                           "dataset_info.json", "state.json"]
    import stages.data.prepare as prepare
    assert prepare.content_digest(prepare.resolve("k", path)) == first["train"]["digest"]
    redrawn = prepare_data(_config(tmp_path, models["llama"], "cpt", path, "data.cpt.eval_fraction=0.25"),
                           models["llama"])
    assert changes(first, redrawn)[0].startswith(f"the held-out split of {path} differs")
    assert changes(first, None) == [f"the checkpoint trained on {path}, this run is configured with "
                                    "the built-in tasks"]


def test_messages_need_a_chat_template(models, tmp_path):
    bare = build_tiny_model(tmp_path / "bare", "qwen2", chat_template=False)
    chats = _write(tmp_path / "chats", "jsonl", [{"messages": c} for c in CHATS])
    cfg = _config(tmp_path, bare, "sft", chats, "data.sft.train.format=messages")
    _refused(cfg, bare, "holds chat messages but the model's tokenizer has no chat template",
             "model.chat_template=")
    template = tmp_path / "template.jinja"
    template.write_text(_tokenizer(models["qwen2"]).chat_template)
    plan = prepare_data(_config(tmp_path, bare, "sft", chats, "data.sft.train.format=messages",
                                f"model.chat_template={template}", "data.sft.eval_fraction=0.2"), bare)
    assert plan["chat_template"] is not None and plan["train"]["rows"] == 16


def test_a_digest_is_remembered_until_the_file_changes(tmp_path, monkeypatch):
    from stages.data import files

    data = tmp_path / "rows.jsonl"
    data.write_text('{"text": "one"}\n{"text": "two"}\n')
    memo = tmp_path / "digests.json"
    files.content_digest(files.resolve("k", str(data)), memo)
    assert not memo.exists()  # written this very moment: not remembered (RACY_SECONDS)
    monkeypatch.setattr(files, "RACY_SECONDS", 0.0)
    first = files.content_digest(files.resolve("k", str(data)), memo)
    assert first == files.content_digest(files.resolve("k", str(data)))  # memo or not, one digest
    with monkeypatch.context() as patched:  # unchanged: answered from the memo, nothing read
        patched.setattr(files, "_hash_files", lambda data: pytest.fail("read again"))
        assert files.content_digest(files.resolve("k", str(data)), memo) == first
    data.write_text('{"text": "ONE"}\n{"text": "two"}\n')  # same size, new bytes
    os.utime(data, ns=(1, 1))  # new times, even within one clock tick of the first write
    changed = files.content_digest(files.resolve("k", str(data)), memo)
    assert changed != first and changed == files.content_digest(files.resolve("k", str(data)))
