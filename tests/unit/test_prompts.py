"""Packaged prompts and the JSONL loader's validation."""

from __future__ import annotations

import json
from importlib import resources

import pytest
from transformers import AutoTokenizer

from energysweep.scenarios.prompts import load_prompts, select_prompts
from energysweep.sweep.tinymodel import build_tiny_model


def _write(tmp_path, lines):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_packaged_prompts():
    prompts = load_prompts()
    assert len(prompts) == 64
    assert all(p.strip() for p in prompts)
    assert len(set(prompts)) == 64
    raw = (resources.files("energysweep") / "data" / "prompts.jsonl").read_text(encoding="utf-8")
    ids = [json.loads(line)["id"] for line in raw.splitlines()]
    assert ids == list(range(64))


def test_packaged_prompt_lengths_vary(tmp_path):
    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "m"))
    counts = sorted(len(ids) for ids in tok(load_prompts())["input_ids"])
    assert counts[0] * 10 <= counts[-1], counts
    # Not just two outliers: a spread of short, middling and long prompts.
    assert counts[len(counts) // 4] * 2 <= counts[3 * len(counts) // 4], counts


def test_load_from_path_keeps_order(tmp_path):
    path = _write(
        tmp_path,
        [json.dumps({"id": 7, "text": "second"}), "", json.dumps({"id": 3, "text": "third"})],
    )
    assert load_prompts(path) == ["second", "third"]
    assert load_prompts(str(path)) == ["second", "third"]


@pytest.mark.parametrize(
    "bad, message",
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "expected an object"),
        ('{"text": "no id"}', "`id` must be an integer"),
        ('{"id": "3", "text": "string id"}', "`id` must be an integer"),
        ('{"id": true, "text": "bool id"}', "`id` must be an integer"),
        ('{"id": 3}', "`text` must be a non-empty string"),
        ('{"id": 3, "text": "   "}', "`text` must be a non-empty string"),
        ('{"id": 0, "text": "duplicate"}', "id 0 already used on line 1"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad, message):
    path = _write(tmp_path, ['{"id": 0, "text": "fine"}', '{"id": 1, "text": "fine"}', bad])
    with pytest.raises(ValueError, match=message) as exc:
        load_prompts(path)
    assert f"{path}:3:" in str(exc.value)


def test_empty_file_is_rejected(tmp_path):
    path = _write(tmp_path, ["", "  "])
    with pytest.raises(ValueError, match="no prompts"):
        load_prompts(path)


def test_select_prompts_cycles():
    prompts = ["a", "b", "c"]
    assert select_prompts(prompts, 2) == ["a", "b"]
    assert select_prompts(prompts, 3) == ["a", "b", "c"]
    assert select_prompts(prompts, 7) == ["a", "b", "c", "a", "b", "c", "a"]
    assert select_prompts(prompts, 0) == []
    assert select_prompts([], 0) == []


def test_select_prompts_rejects_bad_requests():
    with pytest.raises(ValueError):
        select_prompts(["a"], -1)
    with pytest.raises(ValueError):
        select_prompts([], 1)
