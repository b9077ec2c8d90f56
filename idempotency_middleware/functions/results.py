"""How an ``idempotent`` function's result is stored and given back on a replay.

The promise is that a replay returns a value equal to the first call's and of the same
type. JSON values round-trip as they are (falsy ones too: ``None``, ``0``, ``""``, ``[]``,
``{}``, ``False``). Dataclasses and Pydantic models are stored as JSON objects and rebuilt
from the function's return annotation (``-> Order``, ``-> list[Order]``, ``-> Order | None``,
string annotations included), as are ``datetime``, ``date``, ``time``, ``UUID``, ``Decimal``,
enums and tuples named there. Anything else takes a ``serializer=(dumps, loads)`` pair.

Every result is checked when it is stored: if what a replay would rebuild is not equal to
it, or not of its type (a tuple under no annotation, a dataclass the annotation does not
name, a ``NaN``), the call raises ``TypeError`` with the key released, at the first call in
development rather than at the first retry in production.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import functools
import inspect
import types
import typing
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from .payloads import json_default

Decode = Callable[[Any], Any]
Serializer = tuple[Callable[[Any], bytes], Callable[[bytes], Any]]


def _identity(value: Any) -> Any:
    return value


class ResultCodec:
    """Encodes one function's results and decodes its replays. The return annotation is
    resolved at first use, so it may name classes defined after the function."""

    __slots__ = ("_decode", "_function", "_name", "_serializer")

    def __init__(
        self, function: Callable[..., Any], serializer: Serializer | None, name: str
    ) -> None:
        self._function = function
        self._serializer = serializer
        self._name = name  # the function's name in messages
        self._decode: Decode | None = None

    def encode(self, result: Any) -> bytes:
        """The bytes to store; ``TypeError`` when a replay could not give ``result`` back."""
        if self._serializer is not None:
            data = self._serializer[0](result)
            if not isinstance(data, bytes):
                raise TypeError(
                    f"idempotent function {self._name}: serializer's dumps returned "
                    f"{type(data).__qualname__}, not bytes"
                )
            return data
        try:
            data = orjson.dumps(result, default=json_default)
        except TypeError as error:
            raise TypeError(
                f"idempotent function {self._name}: its result ({type(result).__qualname__}) "
                f"cannot be stored as JSON ({error}); return JSON values, dataclasses or "
                "Pydantic models, or pass serializer=(dumps, loads)"
            ) from error
        decode = self._decoder()  # (its own TypeError when the annotation is unresolvable)
        try:
            replayed = decode(orjson.loads(data))
        except (TypeError, ValueError, KeyError) as error:
            # The annotation names a type this result cannot be rebuilt as (a datetime
            # under ``-> date``, another dataclass than the one named).
            raise TypeError(
                f"idempotent function {self._name}: its result ({type(result).__qualname__}) "
                f"cannot be rebuilt from its return annotation ({error!r}); return the type "
                "the annotation names, or pass serializer=(dumps, loads)"
            ) from error
        if not _same(replayed, result):
            raise TypeError(
                f"idempotent function {self._name}: its result ({type(result).__qualname__}) "
                f"would be replayed as {type(replayed).__qualname__} {replayed!r:.80}, not "
                "equal to it; name its type in the return annotation (dataclasses, Pydantic "
                "models, tuples, dates, UUIDs, Decimal), or pass serializer=(dumps, loads)"
            )
        return data

    def decode(self, data: bytes) -> Any:
        """A stored result, rebuilt as the function returned it."""
        if self._serializer is not None:
            return self._serializer[1](data)
        return self._decoder()(orjson.loads(data))

    def _decoder(self) -> Decode:
        decode = self._decode
        if decode is None:
            decode = self._decode = decoder_for(self._return_annotation())
        return decode

    def _return_annotation(self) -> Any:
        function = self._function
        while isinstance(function, functools.partial):
            function = function.func
        if not (inspect.isfunction(function) or inspect.ismethod(function)):
            function = type(function).__call__  # a callable object: its __call__'s
        try:
            hints = typing.get_type_hints(function)
        except Exception as error:
            raise TypeError(
                f"idempotent function {self._name}: its return annotation cannot be resolved "
                f"({error!r}); it names the type results are rebuilt as"
            ) from error
        return hints.get("return", Any)


_IDENTITY_EQ: Any = object.__eq__


def _same(replayed: Any, result: Any) -> bool:
    if type(replayed) is not type(result):
        return False
    if type(result).__eq__ is _IDENTITY_EQ:
        # Compared by identity (a dataclass with eq=False): compare what they store.
        return bool(
            orjson.dumps(replayed, default=json_default)
            == orjson.dumps(result, default=json_default)
        )
    return bool(replayed == result)


_SCALARS: dict[Any, Decode] = {
    datetime.datetime: datetime.datetime.fromisoformat,
    datetime.date: datetime.date.fromisoformat,
    datetime.time: datetime.time.fromisoformat,
    uuid.UUID: uuid.UUID,
    decimal.Decimal: decimal.Decimal,
}


@functools.lru_cache(maxsize=256)
def decoder_for(annotation: Any) -> Decode:
    """A function rebuilding a value of type ``annotation`` from its JSON form (loose:
    what it cannot rebuild it returns as it is, and the check at storing time catches
    the difference)."""
    if annotation is Any or annotation is None or annotation is type(None):
        return _identity
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if origin is typing.Annotated:
        return decoder_for(arguments[0])
    if origin is typing.Union or origin is types.UnionType:
        return _union_decoder(arguments)
    if origin is list:
        item = decoder_for(arguments[0]) if arguments else _identity
        return lambda value: [item(each) for each in value] if isinstance(value, list) else value
    if origin is tuple:
        return _tuple_decoder(arguments)
    if origin is dict:
        item = decoder_for(arguments[1]) if len(arguments) == 2 else _identity
        return lambda value: (
            {key: item(each) for key, each in value.items()} if isinstance(value, dict) else value
        )
    if annotation is tuple:
        return lambda value: tuple(value) if isinstance(value, list) else value
    if not isinstance(annotation, type):
        return _identity  # Literal, TypeVar, Protocol ...: JSON values as they are
    if dataclasses.is_dataclass(annotation):
        return _dataclass_decoder(annotation)
    validate = getattr(annotation, "model_validate", None)  # a Pydantic (v2) model
    if callable(validate):
        return lambda value: validate(value) if isinstance(value, dict) else value
    scalar = _SCALARS.get(annotation)
    if scalar is not None:
        return _from_string(scalar)
    if issubclass(annotation, enum.Enum):
        enum_type = annotation
        return lambda value: enum_type(value)
    return _identity


def _from_string(build: Decode) -> Decode:
    return lambda value: build(value) if isinstance(value, str) else value


def _union_decoder(members: tuple[Any, ...]) -> Decode:
    decoders = [decoder_for(member) for member in members if member is not type(None)]
    rebuilding = [decoder for decoder in decoders if decoder is not _identity]
    if not rebuilding:
        return _identity

    def decode(value: Any) -> Any:
        if value is None:
            return None
        for decoder in rebuilding:
            try:
                return decoder(value)
            except (TypeError, ValueError, KeyError):
                continue  # not this member; try the next
        return value

    return decode


def _tuple_decoder(arguments: tuple[Any, ...]) -> Decode:
    if len(arguments) == 2 and arguments[1] is Ellipsis:
        item = decoder_for(arguments[0])
        return lambda value: (
            tuple(item(each) for each in value) if isinstance(value, list) else value
        )
    items = [decoder_for(argument) for argument in arguments]
    return lambda value: (
        tuple(decode(each) for decode, each in zip(items, value, strict=False))
        if isinstance(value, list)
        else value
    )


def _dataclass_decoder(cls: type[Any]) -> Decode:
    # Field decoders are built at first use: a dataclass may refer to itself (a tree).
    fields: list[tuple[str, Decode]] | None = None

    def decode(value: Any) -> Any:
        nonlocal fields
        if not isinstance(value, dict):
            return value
        if fields is None:
            hints = typing.get_type_hints(cls)
            fields = [
                (field.name, decoder_for(hints.get(field.name, Any)))
                for field in dataclasses.fields(cls)
                if field.init
            ]
        return cls(**{name: item(value[name]) for name, item in fields if name in value})

    return decode
