"""The small read-only view of a request given to ``scope`` callables, for both adapters."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass


class HeaderView(Mapping[str, str]):
    """Case-insensitive, read-only header mapping; repeated headers are joined with ``, ``."""

    __slots__ = ("_items",)

    def __init__(self, raw: Iterable[tuple[str, str]]) -> None:
        items: dict[str, str] = {}
        for name, value in raw:
            lower = name.lower()
            items[lower] = f"{items[lower]}, {value}" if lower in items else value
        self._items = items

    def __getitem__(self, name: str) -> str:
        return self._items[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"HeaderView({sorted(self._items)!r})"


@dataclass(frozen=True)
class RequestView:
    """What a ``scope`` callable may look at.

    ``path`` is the concrete path, ``route`` the matched rule's template (the path itself
    when no rule matched), ``query`` the raw query string, ``client`` ``(host, port)`` or
    ``None``.
    """

    method: str
    path: str
    route: str
    query: str
    headers: HeaderView
    client: tuple[str, int] | None = None
