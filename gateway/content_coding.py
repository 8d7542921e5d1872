"""Content codings (RFC 9110, Section 8.4): request bodies in gzip and deflate, as Triton's HTTP
endpoint takes them (tritonclient's ``request_compression_algorithm``), inflated up to a limit; and
the coding an infer response is compressed in, from the client's Accept-Encoding (tritonclient's
``response_compression_algorithm``).

aiohttp inflates a compressed body on the event loop as it arrives, and goes on inflating one
past the size limit while it drains it: a few MiB of gzip that inflate to GiB held the loop, and
every other request with it, for seconds. So the gateway reads a body as it was sent and undoes
its codings here, in a worker thread, stopping one byte past the limit. Pure: bytes in, bytes out.
"""

from __future__ import annotations

import re
import zlib

# The codings undone here; "x-gzip" is gzip (RFC 9110, 8.4.1.3), "identity" is none.
GZIP_CODINGS = frozenset({"gzip", "x-gzip"})
SUPPORTED = GZIP_CODINGS | {"deflate", "identity"}
# Window bits of zlib: a gzip member, a zlib stream (HTTP's deflate), a raw deflate stream
# (which some clients send as deflate).
GZIP_WBITS, ZLIB_WBITS, RAW_DEFLATE_WBITS = 16 + zlib.MAX_WBITS, zlib.MAX_WBITS, -zlib.MAX_WBITS
# The codings a response may be compressed in, the first preferred where the client weighs them
# alike. "deflate" is a zlib stream, as tritonclient inflates it (zlib.decompress).
RESPONSE_CODINGS = ("gzip", "deflate")
# A response body over this many bytes is compressed in a worker thread, not on the event loop:
# zlib takes milliseconds for 64 KiB of tensor bytes, and tens of them for a MiB.
COMPRESS_ON_LOOP_BYTES = 8 << 10
# zlib's fastest level, nginx's default (gzip_comp_level 1): tensor bytes shrink little at any
# level, and the time spent compressing is the request's.
COMPRESS_LEVEL = 1
# A qvalue (RFC 9110, 12.4.2) in ASCII digits: str.isdigit took "²", which float() refuses.
QVALUE = re.compile(r"[01](\.[0-9]{0,3})?", re.ASCII)


class UnsupportedCoding(ValueError):
    """A Content-Encoding the gateway cannot undo (a 415)."""


class BodyTooLarge(ValueError):
    """The body inflates past the limit (a 413)."""


class BadCoding(ValueError):
    """The body is not in the coding its header names (a 400)."""


def codings_of(content_encoding: str) -> list[str]:
    """The codings a Content-Encoding header lists, in the order they were applied, identity left
    out; UnsupportedCoding names one that is not gzip or deflate."""
    codings = [coding.strip().lower() for coding in content_encoding.split(",") if coding.strip()]
    unknown = [coding for coding in codings if coding not in SUPPORTED]
    if unknown:
        raise UnsupportedCoding(f"Content-Encoding '{unknown[0]}' is not supported; the gateway takes gzip and deflate")
    return [coding for coding in codings if coding != "identity"]


def decode(body: bytes | bytearray, codings: list[str], limit: int) -> bytes:
    """``body`` with ``codings`` undone, last applied first; BodyTooLarge as soon as a step's
    output passes ``limit`` bytes, BadCoding where the bytes are not what the coding says."""
    data = bytes(body)
    for coding in reversed(codings):
        data = _inflate(data, coding, limit)
    return data


def _inflate(data: bytes, coding: str, limit: int) -> bytes:
    out = bytearray()
    gzip = coding in GZIP_CODINGS
    while True:  # gzip: one member after another (RFC 1952, 2.2), as gunzip reads them
        stream = zlib.decompressobj(GZIP_WBITS if gzip else _deflate_wbits(data))
        pending = data
        try:
            while pending:
                # At most one byte past the limit: a bomb is never inflated further than that.
                out += stream.decompress(pending, limit + 1 - len(out))
                if len(out) > limit:
                    raise BodyTooLarge(f"the request body inflates to more than {limit} bytes")
                pending = stream.unconsumed_tail
            out += stream.flush()
        except zlib.error as error:
            raise BadCoding(f"the request body is not valid {coding}: {error}") from None
        if len(out) > limit:
            raise BodyTooLarge(f"the request body inflates to more than {limit} bytes")
        if not stream.eof:
            raise BadCoding(f"the request body is not valid {coding}: it ends before its stream does")
        data = stream.unused_data
        if not data:
            return bytes(out)
        if not gzip:
            raise BadCoding(f"the request body is not valid {coding}: bytes follow the end of its stream")


def _deflate_wbits(data: bytes) -> int:
    """HTTP's deflate is a zlib stream (RFC 1950); a raw deflate stream is taken too."""
    if len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0:
        return ZLIB_WBITS
    return RAW_DEFLATE_WBITS


def response_coding(accept_encoding: str | None) -> str | None:
    """The coding to compress a response in for ``accept_encoding`` (RFC 9110, 12.5.3): the one of
    ``RESPONSE_CODINGS`` the client weighs highest, "*" standing for those it does not name; None
    (no coding) where it accepts neither, or weighs identity above both. An item whose weight is
    not a qvalue is left out, as a header the gateway cannot read is no reason to refuse the answer."""
    if not accept_encoding:
        return None
    weights: dict[str, float] = {}
    for item in accept_encoding.split(","):
        name, _, parameters = item.partition(";")
        name = name.strip().lower()
        weight = _qvalue(parameters)
        if name and weight is not None:
            weights["gzip" if name == "x-gzip" else name] = weight
    anything = weights.get("*", 0.0)
    best = max(RESPONSE_CODINGS, key=lambda coding: weights.get(coding, anything))  # the first at a tie
    weight = weights.get(best, anything)
    if weight <= 0 or weights.get("identity", 0.0) > weight:
        return None
    return best


def _qvalue(parameters: str) -> float | None:
    """The weight ``q`` of an Accept-Encoding item's parameters (1 when it has none); None where it
    is not a qvalue of RFC 9110, 12.4.2 (0 to 1, at most three decimals)."""
    for parameter in parameters.split(";"):
        key, _, value = parameter.partition("=")
        if key.strip().lower() != "q":
            continue
        value = value.strip()
        if QVALUE.fullmatch(value) is None:
            return None
        weight = float(value)
        return weight if weight <= 1 else None
    return 1.0


def compress(data: bytes | bytearray, coding: str) -> bytes:
    """``data`` in ``coding`` (one of ``RESPONSE_CODINGS``): a gzip member, or for deflate a zlib
    stream (RFC 9110 8.4.1.2), at ``COMPRESS_LEVEL``."""
    compressor = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, GZIP_WBITS if coding in GZIP_CODINGS else ZLIB_WBITS)
    return compressor.compress(data) + compressor.flush()
