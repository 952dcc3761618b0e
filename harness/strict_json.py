"""Strict JSON for the bytes the harness does not trust: task files (and, for harness/sandbox.py, the sandbox's
result channel). Python's json module accepts NaN and Infinity, lets the last of two duplicate keys win, recurses
until RecursionError on deep nesting, raises ValueError on an integer of thousands of digits and returns lone
surrogates from \\u escapes. Here each of those is a StrictJSONError whose message is one line naming the file, the
line and the field:

    tasks/x.jsonl:3: field targets[0]: expected a finite number, found NaN

Bounds: nesting depth MAX_DEPTH, integers of at most MAX_INT_DIGITS digits, lines of at most MAX_LINE_BYTES bytes,
files of at most MAX_FILE_BYTES bytes, strict UTF-8 (bad bytes and lone surrogates refused). The audit has its own
reader (evidence_audit/reading.py): the two never import each other.
"""
import json
import math

MAX_DEPTH = 64
MAX_INT_DIGITS = 100
MAX_LINE_BYTES = 1 << 20
MAX_FILE_BYTES = 64 << 20


class StrictJSONError(ValueError):
    def __init__(self, where, line, field, expected, found):
        self.where, self.line, self.field = where, line, field
        at = f"{where}:{line}" if line else f"{where}"
        super().__init__(f"{at}: {f'field {field}: ' if field else ''}expected {expected}, found {found}")


class _Bad:
    """A value the parser hooks refused; found (with its path) by the walk after parsing."""

    def __init__(self, expected, found):
        self.expected, self.found = expected, found


class _Pairs(dict):
    """An object whose pairs held a duplicate key (the first duplicate is kept in .dup)."""
    dup = None


def _object(pairs):
    obj, dup = _Pairs(), None
    for k, v in pairs:
        if k in obj and dup is None:
            dup = k
        obj[k] = v
    if dup is None:
        return dict(obj)
    obj.dup = dup
    return obj


def _int(text):
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        return _Bad(f"an integer of at most {MAX_INT_DIGITS} digits", f"one of {digits} digits")
    return int(text)


def _float(text):
    value = float(text)
    return value if math.isfinite(value) else _Bad("a finite number", text[:40])


def _constant(name):
    return _Bad("a finite number", name)


def _depth(text):
    """The deepest nesting of [ and { outside strings."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _has_lone_surrogate(s):
    return any(0xD800 <= ord(ch) <= 0xDFFF for ch in s)


def _walk(value, path):
    """(field path, expected, found) of the first refused value, or None."""
    if isinstance(value, _Bad):
        return path or "(top level)", value.expected, value.found
    if isinstance(value, str):
        return (path or "(top level)", "valid Unicode text", "a lone surrogate") if _has_lone_surrogate(value) \
            else None
    if isinstance(value, _Pairs):
        return f"{path}.{value.dup}" if path else value.dup, "each key once", "a duplicate key"
    if isinstance(value, dict):
        for k, v in value.items():
            field = f"{path}.{k}" if path else k
            if _has_lone_surrogate(k):
                return field, "valid Unicode text in a key", "a lone surrogate"
            found = _walk(v, field)
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _walk(v, f"{path}[{i}]")
            if found:
                return found
    return None


def loads(text, where="<input>", line=None, document="one JSON document"):
    """One JSON document from str `text`, strictly; StrictJSONError names `where`, `line` and the field."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_LINE_BYTES:
        raise StrictJSONError(where, line, None, f"a line of at most {MAX_LINE_BYTES} bytes",
                              f"{len(text.encode('utf-8', 'surrogatepass'))} bytes")
    depth = _depth(text)
    if depth > MAX_DEPTH:
        raise StrictJSONError(where, line, None, f"nesting at most {MAX_DEPTH} deep", f"{depth} levels")
    try:
        value = json.loads(text, object_pairs_hook=_object, parse_int=_int, parse_float=_float,
                           parse_constant=_constant)
    except json.JSONDecodeError as e:
        raise StrictJSONError(where, line, None, document, f"invalid JSON ({e.msg} at column {e.colno})") \
            from None
    except (ValueError, RecursionError) as e:     # belt and braces: nothing here may escape as a traceback
        raise StrictJSONError(where, line, None, document, f"invalid JSON ({str(e).splitlines()[0][:80]})") \
            from None
    bad = _walk(value, "")
    if bad:
        raise StrictJSONError(where, line, *bad)
    return value


def decode_utf8(raw, where="<input>"):
    """Bytes -> str, strict UTF-8 and bounded in size; StrictJSONError names the line of the first bad byte."""
    if len(raw) > MAX_FILE_BYTES:
        raise StrictJSONError(where, None, None, f"at most {MAX_FILE_BYTES} bytes", f"{len(raw)} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise StrictJSONError(where, raw[:e.start].count(b"\n") + 1, None, "UTF-8 text",
                              f"byte {raw[e.start]:#04x}") from None


def parse_jsonl(raw, where="<input>", skip=lambda line: not line.strip()):
    """[(line number, value)] of JSON-lines bytes read strictly; lines for which skip(line) is true are left out
    (default: blank lines). Lines are split on \\n only."""
    text = decode_utf8(raw, where)
    return [(n, loads(line, where, n, "one JSON object per line"))
            for n, line in enumerate(text.split("\n"), start=1) if not skip(line)]
