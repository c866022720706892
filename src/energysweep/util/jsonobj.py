"""Parsing one JSON object from user-supplied text, with an error that says where it came from."""

from __future__ import annotations

import json


def parse_object(
    text: str,
    where: str,
    error: type[Exception] = ValueError,
    not_json: str = "not valid JSON",
    not_object: str = "expected an object",
) -> dict:
    """``text`` parsed as a JSON object.

    Args:
        text: the JSON text (a JSONL line, an environment variable's value).
        where: what the text is, for the message (``file:line``, a variable's name).
        error: the exception type to raise.
        not_json: the message's words for text that is not JSON.
        not_object: the message's words for JSON that is not an object.

    Raises:
        error: ``"<where>: <not_json> (<parser's reason>): <text>"`` or
            ``"<where>: <not_object>, got <text>"``.
    """
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: {not_json} ({exc.msg}): {text!r}") from None
    if not isinstance(obj, dict):
        raise error(f"{where}: {not_object}, got {text!r}")
    return obj
