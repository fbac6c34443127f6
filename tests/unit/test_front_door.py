"""The README is a front door: at most 300 lines, and no development diary. A commit hash
may appear only inside a generated block (between `<!-- baton ... -->` and `<!-- end
... -->`, written by the command the marker names) and in the one sentence that frames
the report block."""
from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
HASH = re.compile(r"\b[0-9a-f]{7,40}\b")
MAX_LINES = 300


def _outside_generated_blocks(text: str) -> list[str]:
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith("<!-- baton ") and "do not edit" in line:
            inside = True
        elif line.startswith("<!-- end "):
            inside = False
        elif not inside:
            lines.append(line)
    return lines


def test_the_readme_is_at_most_300_lines():
    count = len(README.read_text().splitlines())
    assert count <= MAX_LINES, f"README.md has {count} lines; the front door holds {MAX_LINES}"


def test_no_commit_hash_outside_generated_blocks_but_the_reports_own():
    text = README.read_text()
    report = re.search(r"code ([0-9a-f]{7,40})(?:-dirty)?", text)
    allowed = {report.group(1)} if report else set()
    found = [(line, hashes) for line in _outside_generated_blocks(text)
             if (hashes := set(HASH.findall(line)) - allowed)
             and any(re.search(r"[a-f]", h) and re.search(r"\d", h) for h in hashes)]
    assert not found, "commit hashes in the README's prose (a diary belongs in docs/results/):\n" + \
        "\n".join(line for line, _ in found)


def test_overrides_are_key_value_words_and_option_values_stay_arguments():
    from baton.cli import split_overrides

    args, overrides = split_overrides(
        ["probe", "--why", "pinned MKL_CBWR=COMPATIBLE (was AVX2)", "stage.max_steps=4",
         "+extra.key=1", "selection@pipeline.handoffs.cpt_sft.selection=latest", "./odd=path"])
    assert args == ["probe", "--why", "pinned MKL_CBWR=COMPATIBLE (was AVX2)", "./odd=path"]
    assert overrides == ["stage.max_steps=4", "+extra.key=1",
                         "selection@pipeline.handoffs.cpt_sft.selection=latest"]
