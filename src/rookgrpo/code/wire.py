"""Plain data across the sandbox boundary: a strict value codec and length-prefixed message framing.

The trusted side (the test runner) and the sandboxed program exchange only plain values: ``None``, ``bool``,
``int``, ``float``, ``str``, ``bytes``, ``complex``, ``list``, ``tuple``, ``dict``, ``set``, ``frozenset``, built
from exact builtin types (a subclass, whatever its ``__eq__`` says, is not plain). Encoding turns anything else into
an ``Unsupported`` marker that equals nothing. Decoding is strict and bounded (nesting depth, message size, digits of
an integer): a malformed, oversized or hostile message raises :class:`WireError`, which the trusted side counts as a
failed test, never as an exception out of the reward.

Direction: the trusted side writes requests as Python literals of plain data (:func:`write_literal`); the sandbox
answers in JSON, produced by ``_sandbox_server.encode_value`` and read here with :func:`loads` and :func:`decode`.
Between the trainer and its runner processes (both trusted) messages are JSON both ways (:func:`write_message`).
"""

import json
import os
import select
import struct
import time

from ._sandbox_server import MAX_DEPTH, encode_value

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_INT_DIGITS = 1000
_HEADER = struct.Struct(">I")


class WireError(Exception):
    """A message or value that is not valid plain data (malformed, too deep, too large)."""


class Unsupported:
    """A value of a type that does not cross the boundary (e.g. an object with a custom ``__eq__``): equals nothing."""

    __slots__ = ("type_name",)

    def __init__(self, type_name):
        self.type_name = str(type_name)[:100]

    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    __hash__ = object.__hash__

    def __repr__(self):
        return f"<unsupported {self.type_name}>"


def encode(value):
    """``value`` as JSON-ready plain data, exactly as the sandbox encodes an answer (the encoder lives in
    ``_sandbox_server``, the one copy both sides use); non-plain parts become ``{"__t": "unsupported"}``."""
    return json.loads(encode_value(value))


def is_plain(value, depth=0) -> bool:
    """Whether ``value`` is plain data of exact builtin types (what may be sent to the sandbox as a literal)."""
    if depth > MAX_DEPTH:
        return False
    kind = type(value)
    if value is None or kind in (bool, int, float, str, bytes, complex):
        return True
    if kind in (list, tuple, set, frozenset):
        return all(is_plain(x, depth + 1) for x in value)
    if kind is dict:
        return all(is_plain(k, depth + 1) and is_plain(v, depth + 1) for k, v in value.items())
    return False


def write_all(fd, data):
    """Write all of ``data`` to file descriptor ``fd`` (a pipe may take it in pieces)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_literal(fd, value):
    """Send plain data to the sandbox as a length-prefixed Python literal (it reads it with ``eval``, no builtins)."""
    body = repr(value).encode("utf-8", "surrogatepass")
    write_all(fd, _HEADER.pack(len(body)) + body)


def decode(data, depth=0):
    """Inverse of :func:`encode`, strict: anything else raises :class:`WireError`."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    kind = type(data)
    if data is None or kind in (bool, int, str):
        return data
    if kind is float:
        return data
    if kind is list:
        return [decode(x, depth + 1) for x in data]
    if kind is not dict or set(data) != {"__t", "v"}:
        raise WireError("malformed value")
    tag, body = data["__t"], data["v"]
    if tag == "float" and body in ("inf", "-inf", "nan"):
        return float(body)
    if tag in ("tuple", "set", "frozenset") and type(body) is list:
        items = [decode(x, depth + 1) for x in body]
        try:
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
        except TypeError as exc:  # an unhashable member of a set
            raise WireError("unhashable set member") from exc
    if tag == "dict" and type(body) is list:
        out = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise WireError("malformed dict item")
            try:
                out[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
            except TypeError as exc:
                raise WireError("unhashable dict key") from exc
        return out
    if tag == "bytes" and type(body) is str:
        try:
            return bytes.fromhex(body)
        except ValueError as exc:
            raise WireError("malformed bytes") from exc
    if tag == "complex" and type(body) is list and len(body) == 2:
        real, imag = (decode(x, depth + 1) for x in body)
        if type(real) is float and type(imag) is float:
            return complex(real, imag)
    if tag == "unsupported" and type(body) is str:
        return Unsupported(body)
    raise WireError("malformed value")


def _parse_int(text):
    if len(text) > MAX_INT_DIGITS:
        raise WireError("integer too long")
    return int(text)


def loads(raw):
    """Parse one message body (bytes) into a dict; :class:`WireError` for anything that is not."""
    if len(raw) > MAX_MESSAGE_BYTES:
        raise WireError("message too large")
    try:
        message = json.loads(raw.decode("utf-8"), parse_int=_parse_int)
    except (ValueError, RecursionError, UnicodeDecodeError, MemoryError) as exc:
        raise WireError(f"unreadable message ({type(exc).__name__})") from exc
    if type(message) is not dict:
        raise WireError("a message must be a JSON object")
    return message


def dumps(message):
    return json.dumps(message, separators=(",", ":")).encode("utf-8")


def write_message(fd, message):
    """Write one length-prefixed message to file descriptor ``fd``."""
    body = dumps(message)
    write_all(fd, _HEADER.pack(len(body)) + body)


def read_exact(fd, n, deadline=None):
    """Read exactly ``n`` bytes from ``fd``; ``None`` at end of file. With ``deadline`` (a ``time.monotonic()``
    value), :class:`TimeoutError` when the bytes have not all arrived by then; else blocking."""
    chunks, missing = [], n
    while missing:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(missing, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


def read_message(fd, deadline=None):
    """Read one length-prefixed message; ``None`` at end of file. ``deadline``: as in :func:`read_exact`."""
    header = read_exact(fd, _HEADER.size, deadline)
    if header is None:
        return None
    (length,) = _HEADER.unpack(header)
    if length > MAX_MESSAGE_BYTES:
        raise WireError("message too large")
    body = read_exact(fd, length, deadline)
    if body is None:
        return None
    return loads(body)
