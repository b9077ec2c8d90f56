"""Capturing an HTTP response as the app sends it: which responses stream live instead of
being buffered, whether a body arrived whole, and the buffer that collects it. Shared by the
ASGI, WSGI and Django doors; what is then stored is the record format's (``stores.records``).
"""

from __future__ import annotations

import functools
import io

from ..stores.records import Headers

# Responses of these media types go to the client live instead of being buffered: a stream
# can be endless, and its client is reading as it comes. The key is still completed (never
# run twice); a retry gets 410 because there is no body to replay.
STREAMING_MEDIA_TYPES = frozenset(
    {
        "text/event-stream",
        "application/x-ndjson",
        "application/stream+json",
        "multipart/x-mixed-replace",
    }
)


def scan_response_headers(headers: Headers) -> tuple[bool, int | None]:
    """In one pass over a response's headers: whether it streams (its first Content-Type is
    one of ``STREAMING_MEDIA_TYPES``) and the Content-Length it declares (its first one, if
    well formed), which presizes its buffer."""
    streaming: bool | None = None
    length: int | None = None
    length_seen = False
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"content-type":
            if streaming is None:
                streaming = _is_streaming_media(value)
        elif lowered == b"content-length" and not length_seen:
            length_seen = True
            try:
                length = int(value)
            except ValueError:
                length = None
    return bool(streaming), length


@functools.lru_cache(maxsize=256)
def _is_streaming_media(content_type: bytes) -> bool:
    media_type = content_type.split(b";", 1)[0].strip().lower().decode("latin-1")
    return media_type in STREAMING_MEDIA_TYPES


class UnfinishedResponse(Exception):
    """The app's response did not finish (ASGI: no ``more_body=False``; any door: a body
    shorter or longer than its ``Content-Length``). Raised by a door's capture into the
    attempt, which releases the key: nothing is stored, and a retry runs again. The door
    then hands the client what it captured, so the server cuts it as it would have."""


def is_complete(status: int, declared: int | None, size: int) -> bool:
    """Whether a body of ``size`` bytes matches the ``Content-Length`` its response
    declared (``None``: none, or malformed). 1xx, 204 and 304 responses carry no body
    whatever a Content-Length says (a 304's is the selected representation's)."""
    return declared is None or declared == size or status < 200 or status in (204, 304)


class BodyBuffer:
    """Collects a response body as the app sends it.

    A body sent in one chunk is kept as it is (no copy). A chunked body whose Content-Length
    was declared (``expected_size``) goes into a ``BytesIO`` allocated at that size once,
    which ``getvalue()`` hands over without a copy: about one copy of the body at peak.
    Without a declared length, chunks are kept and joined at the end (two copies at peak;
    a buffer left to grow would reallocate, and copy, as it grows).
    """

    __slots__ = ("_chunks", "_presized", "expected_size")

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._presized: io.BytesIO | None = None
        self.expected_size: int | None = None

    def add(self, chunk: bytes) -> None:
        if not chunk:
            return
        if self._presized is not None:
            self._presized.write(chunk)
            return
        self._chunks.append(chunk)
        size = self.expected_size
        if len(self._chunks) == 2 and size is not None and 0 < size <= _MAX_PRESIZE:
            self._presized = io.BytesIO()
            self._presized.seek(size - 1)
            self._presized.write(b"\0")  # allocates the whole size at once
            self._presized.seek(0)
            for kept in self._chunks:
                self._presized.write(kept)
            self._chunks = []

    @property
    def empty(self) -> bool:
        return self._presized is None and not self._chunks

    def take(self) -> bytes:
        """The whole body; the buffer is empty afterwards."""
        presized, self._presized = self._presized, None
        if presized is not None:
            presized.truncate()  # drop what was declared but never sent
            return presized.getvalue()
        chunks, self._chunks = self._chunks, []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# A declared length above this is not trusted for presizing (an app bug should not allocate
# gigabytes up front); such a body is kept as chunks and joined.
_MAX_PRESIZE = 256 * 1024 * 1024
