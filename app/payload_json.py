"""Reading the JSON a caller sends: what `json.loads` reads, and a document it cannot read
although it is valid JSON (a number over the interpreter's digit limit, nesting past the
recursion limit) read with markers in those places, so the request is refused naming the
field instead of crashing the parser (HTTP bodies, Celery messages, the CLI's --metadata)."""

from __future__ import annotations

import json
import sys
import uuid
from dataclasses import dataclass
from typing import Any

# A payload nested deeper than this (the whole document) is not parsed past it: what lies
# below is read as unreadable, so the request is refused with its key, not lost with it.
PAYLOAD_MAX_DEPTH = 64


@dataclass(frozen=True)
class Unreadable:
    """A value of a payload that JSON may carry but Python will not read (a number of more
    digits than the interpreter converts, a container nested past PAYLOAD_MAX_DEPTH); it
    stands in its place so the payload is refused naming the field."""

    why: str


def loads_payload(text: str | bytes | bytearray | memoryview, object_hook: Any = None) -> Any:
    """JSON as `json.loads` reads it; a document it cannot read although it is valid JSON
    (a number over the interpreter's digit limit, nesting deeper than the recursion limit)
    is read with `Unreadable` in place of those values. Invalid JSON raises ValueError."""
    if isinstance(text, memoryview | bytearray):
        text = bytes(text)
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    try:
        return json.loads(text, object_hook=object_hook)
    except json.JSONDecodeError:
        raise
    except (ValueError, RecursionError):
        # ValueError that is not a JSONDecodeError: an integer past the digit limit.
        pass
    placeholder = f"\x00too-deep-{uuid.uuid4()}"
    shallow = _cut_deeper_than(text, PAYLOAD_MAX_DEPTH, json.dumps(placeholder))
    data = json.loads(shallow, object_hook=object_hook, parse_int=_bounded_int)
    too_deep = Unreadable(f"nested deeper than {PAYLOAD_MAX_DEPTH} levels")
    return _replace_placeholder(data, placeholder, too_deep)


def _bounded_int(digits: str) -> int | Unreadable:
    limit = sys.get_int_max_str_digits()
    count = len(digits.lstrip("-"))
    if limit and count > limit:
        return Unreadable(f"a number of {count} digits; at most {limit}")
    return int(digits)


def _cut_deeper_than(text: str, max_depth: int, placeholder: str) -> str:
    # One pass, no recursion: each array or object opened below max_depth is replaced,
    # with everything in it, by `placeholder` (brackets inside strings do not count).
    pieces: list[str] = []
    depth, start, cut_at = 0, 0, 0
    in_string = escaped = False
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth == max_depth + 1:
                cut_at = index
        elif char in "]}":
            if depth == max_depth + 1:
                pieces += [text[start:cut_at], placeholder]
                start = index + 1
            depth -= 1
    pieces.append(text[start:])
    return "".join(pieces)


def _replace_placeholder(data: Any, placeholder: str, marker: Unreadable) -> Any:
    if data == placeholder:
        return marker
    stack = [data] if isinstance(data, dict | list) else []
    while stack:  # at most PAYLOAD_MAX_DEPTH deep now, but no recursion all the same
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in list(items):
            if value == placeholder:
                node[key] = marker
            elif isinstance(value, dict | list):
                stack.append(value)
    return data


def unreadable_in(payload: dict[Any, Any]) -> str | None:
    """Which field of `payload` holds an Unreadable, and why (None: none does); no
    recursion. Only the field is named: the path down to it may be 64 levels long."""
    for field, value in payload.items():
        stack = [value]
        while stack:
            node = stack.pop()
            if isinstance(node, Unreadable):
                shown = f"{field} is" if node is value else f"{field} has a value that is"
                return f"{shown} {node.why}"
            if isinstance(node, dict):
                stack += node.values()
            elif isinstance(node, list | tuple):
                stack += node
    return None


def nesting_depth(value: Any, stop_after: int) -> int:
    """How deep `value` nests (a scalar 0, `{}` 1), counted without recursion and no
    further than `stop_after` + 1."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, dict | list | tuple):
            continue
        deepest = max(deepest, depth)
        if deepest > stop_after:
            break
        stack += [(item, depth + 1) for item in (node.values() if isinstance(node, dict) else node)]
    return deepest
