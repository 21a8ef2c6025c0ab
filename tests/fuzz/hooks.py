"""Schemathesis hooks for scripts/fuzz-api (loaded through SCHEMATHESIS_HOOKS).

Two operations block until something happens or their `timeout_s` passes: GET
/api/channels/{channel}/wait (default 30 s) and POST /api/channels/{channel}/ask (default 50 s).
Fuzzed as they come, each example would hold the run for up to that long, so just before every
call this caps their `timeout_s` at CAP seconds: an absent value (or null, which also means the
default) is given CAP, and a larger number (or numeric string) is lowered to CAP. Anything else
(a non-numeric string, a negative number, NaN, infinity, an object, ...) is sent exactly as
generated, so the relay's rejection of bad timeouts is still fuzzed. Nothing else about any
request is changed.

`before_call` runs in every phase (examples, coverage, fuzzing, stateful) right before the
request is sent, and schemathesis revalidates the case afterwards, so a negative case this turns
valid is judged as valid.
"""

from __future__ import annotations

import math
import re

import schemathesis

CAP = 0.2

_BLOCKING = {
    ("GET", "/api/channels/{channel}/wait"): "query",
    ("POST", "/api/channels/{channel}/ask"): "body",
}

_NUMBER = re.compile(r"^\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*$")


def _capped(value):
    """The value to send in place of `value`: CAP for a number of seconds above CAP."""
    if isinstance(value, bool):
        return value
    if value is None:
        # null: the relay's default (30 or 50 s).
        return CAP
    if not (isinstance(value, (int, float)) or (isinstance(value, str) and _NUMBER.match(value))):
        return value
    try:
        number = float(value)
    except OverflowError:
        # An integer too large for a double: the relay reads it as infinite, or not at all.
        return value
    if math.isfinite(number) and number > CAP:
        # Keep the type: a string stays a string.
        return CAP if isinstance(value, (int, float)) else str(CAP)
    return value


@schemathesis.hook
def before_call(context, case, kwargs):
    where = _BLOCKING.get((case.operation.method.upper(), case.operation.path))
    if where == "query":
        if case.query is None:
            case.query = {}
        if isinstance(case.query, dict):
            value = case.query.get("timeout_s")
            if isinstance(value, list):
                # A repeated query parameter: cap every occurrence.
                case.query["timeout_s"] = [_capped(v) for v in value]
            else:
                case.query["timeout_s"] = _capped(value)
    elif where == "body":
        body = case.body
        if isinstance(body, dict):
            body["timeout_s"] = _capped(body.get("timeout_s"))
