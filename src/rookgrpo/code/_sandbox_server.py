"""The untrusted side of the code sandbox, run inside it as ``python -I -S -c <this file> REQ RESP [LIMITS]``.

It receives the model's program over the REQ pipe, runs it, then answers call requests ("call function NAME with
these plain arguments") with the plain value returned, as JSON (:func:`encode_value`), or the name of the exception
raised. It never receives a test, an expected value or a secret, so nothing the program does to this code (patching
it, writing to the pipes itself, exiting early) can do more than claim a return value, which the trusted side then
decodes strictly (:mod:`rookgrpo.code.wire`) and judges. In "program" mode (stdin/stdout tests) it closes the pipes and
runs the program as a script.

Requests are Python literals of plain data written by the trusted side, read with ``eval`` and no builtins. This file
imports nothing but ``os``, ``sys`` and (to set LIMITS, the rlimits, before it reads the program) ``resource``: the
sandbox's interpreter starts with ``-I -S`` in a few milliseconds, and ``import json`` alone (which pulls in ``re``)
would double that. The package imports this module for :func:`encode_value` only; the serve loop runs when it is
``__main__``.
"""

import os
import sys

MAX_DEPTH = 64
MAX_INT_BITS = 3321  # about 1,000 decimal digits, the trusted side's limit
_ESCAPES = {i: "\\u%04x" % i for i in range(32)}
_ESCAPES.update({34: '\\"', 92: "\\\\"})
_INF = float("inf")


def _json_str(text):
    text = text.translate(_ESCAPES)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates cannot be UTF-8: escape them
        text = "".join("\\u%04x" % ord(c) if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
    return '"' + text + '"'


def _tagged(tag, body):
    return '{"__t":"' + tag + '","v":' + body + "}"


def encode_value(value, depth=0):
    """``value`` as JSON text in the wire format: plain values by exact type, tags for the rest.

    >>> encode_value([1, (2.5, "a"), {"k": None}, float("inf"), object()])
    '[1,{"__t":"tuple","v":[2.5,"a"]},{"__t":"dict","v":[["k",null]]},{"__t":"float","v":"inf"},{"__t":"unsupported","v":"object"}]'
    """
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    kind = type(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        if value.bit_length() > MAX_INT_BITS:
            raise ValueError("integer too large")
        return str(value)
    if kind is float:
        if value != value or value in (_INF, -_INF):
            return _tagged("float", '"' + repr(value) + '"')
        return repr(value)
    if kind is str:
        return _json_str(value)
    if kind is list:
        return "[" + ",".join(encode_value(x, depth + 1) for x in value) + "]"
    if kind in (tuple, set, frozenset):
        items = value if kind is tuple else sorted(value, key=repr)
        return _tagged(kind.__name__, "[" + ",".join(encode_value(x, depth + 1) for x in items) + "]")
    if kind is dict:
        pairs = ("[" + encode_value(k, depth + 1) + "," + encode_value(v, depth + 1) + "]" for k, v in value.items())
        return _tagged("dict", "[" + ",".join(pairs) + "]")
    if kind is bytes:
        return _tagged("bytes", '"' + value.hex() + '"')
    if kind is complex:
        return _tagged("complex", "[" + encode_value(value.real) + "," + encode_value(value.imag) + "]")
    return _tagged("unsupported", _json_str(getattr(kind, "__name__", "?")))


def _read(fd):
    """One length-prefixed request, as the Python value it spells; None at end of input."""
    data = b""
    while len(data) < 4:
        chunk = os.read(fd, 4 - len(data))
        if not chunk:
            return None
        data += chunk
    missing, parts = int.from_bytes(data, "big"), []
    while missing:
        chunk = os.read(fd, min(missing, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        missing -= len(chunk)
    names = {"__builtins__": {}, "inf": _INF, "nan": float("nan"), "set": set, "frozenset": frozenset}
    return eval(b"".join(parts).decode("utf-8"), names)  # the trusted side's literal of plain data


def _write(fd, text):
    data = text.encode("utf-8", "surrogatepass")
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data):]


def _limit(spec):
    """Lower this process's rlimits (inherited by everything it starts) before any of the program runs.

    ``spec``: ``NAME=VALUE`` pairs joined by commas, e.g. ``AS=1073741824,CPU=10,NPROC=32``. Trusted code runs here;
    once lowered, the hard limits cannot be raised again from inside the sandbox (that needs CAP_SYS_RESOURCE in the
    host's user namespace). Any failure ends the sandbox before the program is read.
    """
    import resource

    for item in spec.split(","):
        name, value = item.split("=")
        value = int(value)
        resource.setrlimit(getattr(resource, "RLIMIT_" + name), (value, value))


def _serve():
    req, resp = int(sys.argv[1]), int(sys.argv[2])
    if len(sys.argv) > 3:
        _limit(sys.argv[3])
    first = _read(req)
    if type(first) is not dict or type(first.get("code")) is not str:
        return
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    if first.get("mode") == "program":
        os.close(req)
        os.close(resp)
        exec(compile(first["code"], "solution.py", "exec"), namespace)
        return
    try:
        exec(compile(first["code"], "solution.py", "exec"), namespace)
    except BaseException as exc:  # noqa: BLE001 (anything the program raises, SystemExit included, is a failed load)
        _write(resp, '{"loaded":false,"error":' + _json_str(type(exc).__name__) + "}")
        return
    _write(resp, '{"loaded":true}')
    while True:
        request = _read(req)
        if request is None:
            return
        seq, name, args, kwargs = request
        try:
            answer = '{"seq":' + str(seq) + ',"value":' + encode_value(namespace[name](*args, **kwargs)) + "}"
        except BaseException as exc:  # noqa: BLE001
            answer = '{"seq":' + str(seq) + ',"raised":' + _json_str(type(exc).__name__) + "}"
        _write(resp, answer)


if __name__ == "__main__":
    _serve()
