"""A stored record as ``show`` prints it: as what it records.

A record does not say which door wrote it: the command does. An HTTP key (``--route``) holds
a response, printed as one (status, headers, body); a function's key (``--function``) holds
the function's result, printed decoded, with the record's status; a consumer's key
(``--consumer``) holds its handler's result and the verdict a redelivery of the message gets.
The command line holds no encryption key and runs no ``loads``: an encrypted result says so,
and bytes a function's ``serializer`` wrote (not JSON) are printed as hex, never unpickled.
"""

from __future__ import annotations

from datetime import datetime, timezone

import orjson

from ..stores.records import COMPLETED, Record, SealedResponse, UnreadableResponse


def iso_time(epoch_seconds: float) -> str:
    """Epoch seconds as ISO 8601 UTC to the millisecond: ``2026-11-23T10:15:00.123Z``."""
    moment = datetime.fromtimestamp(epoch_seconds, tz=timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _deadlines(record: Record) -> dict[str, object]:
    return {
        "lock_expires_at": iso_time(record.lock_expires_at),
        "expires_at": iso_time(record.expires_at),
    }


def record_as_json(record: Record) -> dict[str, object]:
    """An HTTP key's record as printable JSON: the body as text when it is UTF-8, else as
    hex; the deadlines in ISO 8601 UTC."""
    described: dict[str, object] = {
        "key_hash": record.key_hash,
        "status": record.status.value,
        "fingerprint": record.fingerprint,
        **_deadlines(record),
        "response_size": record.response_size,
        "response_not_stored": record.response_not_stored,
    }
    if type(record.response) is SealedResponse:
        # The command line holds no key: it says so rather than print ciphertext as a body.
        described["response"] = {"encrypted": True, "size": len(record.response.body)}
    elif type(record.response) is UnreadableResponse:
        described["response"] = {"unreadable": record.response.reason}
    elif record.response is not None:
        body = record.response.body
        try:
            text: str | None = body.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        described["response"] = {
            "status": record.response.status,
            "headers": [
                [name.decode("latin-1"), value.decode("latin-1")]
                for name, value in record.response.headers
            ],
            "body": text if text is not None else None,
            "body_hex": body.hex() if text is None else None,
        }
    return described


def result_as_json(record: Record) -> dict[str, object]:
    """What a function's record holds of its result: ``result`` (the JSON value it was
    stored as, the way a replay's decoding starts), or why there is none to print."""
    response = record.response
    if record.response_not_stored:
        return {"result_not_stored": True, "result_size": record.response_size}
    if response is None:
        return {}  # (in progress: no result yet)
    if type(response) is SealedResponse:
        return {"result_encrypted": True, "result_size": len(response.body)}
    if type(response) is UnreadableResponse:
        return {"result_unreadable": response.reason}
    try:
        result: object = orjson.loads(response.body)
    except orjson.JSONDecodeError:
        # Bytes of the function's serializer=(dumps, loads): not run here (it may unpickle).
        return {"result_hex": response.body.hex(), "result_size": len(response.body)}
    return {"result": result, "result_size": len(response.body)}


def function_record_as_json(record: Record, name: str, key: str) -> dict[str, object]:
    """A function's record as printable JSON: which key, its status, its decoded result."""
    return {
        "function": name,
        "key": key,
        "key_hash": record.key_hash,
        "status": record.status.value,
        **result_as_json(record),
        "fingerprint": record.fingerprint,
        **_deadlines(record),
    }


# What a redelivery of the message does, by the verdict the consumer gives it.
VERDICT_MEANINGS = {
    "ack": "a redelivery is acknowledged with the stored result; the handler does not run",
    "retry": "a delivery holds the key: a redelivery is retried, and runs the handler only if "
    "that delivery's claim expires (lock_expires_at) unfinished",
    "dead": "the stored result cannot be read: a redelivery is given up on (on_exhausted), "
    "never run again under this key",
}


def verdict_of(record: Record) -> str:
    """The verdict ``IdempotentConsumer`` gives a redelivery of the message this record's
    key belongs to (``ack``, ``retry`` or ``dead``)."""
    if record.status is not COMPLETED:
        return "retry"
    if type(record.response) is UnreadableResponse:
        return "dead"
    return "ack"


def consumer_record_as_json(record: Record, name: str, key: str) -> dict[str, object]:
    """A consumer's record as printable JSON: the verdict, then what a function's shows."""
    verdict = verdict_of(record)
    described: dict[str, object] = {
        "consumer": name,
        "key": key,
        "verdict": verdict,
        "verdict_means": VERDICT_MEANINGS[verdict],
    }
    described.update(function_record_as_json(record, name, key))
    del described["function"]
    return described


__all__ = [
    "consumer_record_as_json",
    "function_record_as_json",
    "iso_time",
    "record_as_json",
    "result_as_json",
    "verdict_of",
]
