"""Workload prompts: the packaged set or a user JSONL file of {"id": int, "text": str}."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from energysweep.util.jsonobj import parse_object

PACKAGED = "prompts.jsonl"


def _packaged_text() -> tuple[str, str]:
    res = resources.files("energysweep") / "data" / PACKAGED
    return str(res), res.read_text(encoding="utf-8")


def load_prompts(path: str | Path | None = None) -> list[str]:
    """Read prompts from a JSONL file, one {"id": int, "text": str} object per line.

    Blank lines are skipped; the order of the file is kept.

    Args:
        path: JSONL file; None means the 64 prompts shipped with the package.

    Returns:
        The prompt texts in file order.

    Raises:
        ValueError: If a line is not a JSON object with an integer `id` and a non-empty string
            `text`, if an id repeats, or if the file holds no prompts. The message names the
            file and the 1-based line.
    """
    if path is None:
        name, content = _packaged_text()
    else:
        name, content = str(path), Path(path).read_text(encoding="utf-8")
    prompts: list[str] = []
    seen: dict[int, int] = {}
    for lineno, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        obj = parse_object(line, where, not_object='expected an object {"id": int, "text": str}')
        pid, text = obj.get("id"), obj.get("text")
        # bool is an int subclass; `true` as an id is a mistake, not id 1.
        if type(pid) is not int:
            raise ValueError(f"{where}: `id` must be an integer, got {pid!r}")
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{where}: `text` must be a non-empty string, got {text!r}")
        if pid in seen:
            raise ValueError(f"{where}: id {pid} already used on line {seen[pid]}")
        seen[pid] = lineno
        prompts.append(text)
    if not prompts:
        raise ValueError(f"{name}: no prompts in file")
    return prompts


def select_prompts(prompts: list[str], n: int) -> list[str]:
    """Take the first `n` prompts, cycling from the start when `n` exceeds the list.

    Cycling lets a workload ask for more requests than there are distinct prompts; prompt i is
    `prompts[i % len(prompts)]`, so the selection is the same on every rank and run.

    Args:
        prompts: Prompt texts, at least one.
        n: Number of prompts wanted, >= 0.

    Returns:
        A new list of exactly `n` prompts.

    Raises:
        ValueError: If `n` is negative or `prompts` is empty while `n` > 0.
    """
    if n < 0:
        raise ValueError(f"number of prompts must be >= 0, got {n}")
    if n and not prompts:
        raise ValueError("cannot select prompts from an empty list")
    return [prompts[i % len(prompts)] for i in range(n)]
