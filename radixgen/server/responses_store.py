"""The responses the server keeps for ``previous_response_id`` and ``GET /v1/responses/{id}``.

In memory only, bounded: at most ``capacity`` responses and ``max_bytes`` of their text, the
least recently stored or used going first. A response keeps its object (what GET answers) and
its conversation as chat messages (the chained input and its own output, without
``instructions``, which OpenAI does not carry to the next turn); a follow-up's conversation
shares the message objects of the earlier one, so a chain costs one reference per message
and turn (its size counts every message of every turn: the bound errs on the safe side). A
server restart forgets everything.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson

from .protocol import ChatMessage

DEFAULT_CAPACITY = 1024
DEFAULT_MAX_BYTES = 128 * 2**20


@dataclass(frozen=True, slots=True)
class StoredResponse:
    body: dict[str, Any]  # the response object
    conversation: tuple[ChatMessage, ...]  # input (with earlier turns) and output
    input_items: tuple[dict[str, Any], ...] = ()  # its own input, as GET .../input_items lists it
    size: int = field(init=False)  # bytes of its JSON and text, about

    def __post_init__(self) -> None:
        text = sum(len(m.text) + 64 for m in self.conversation)
        items = len(orjson.dumps(self.input_items))
        object.__setattr__(self, "size", len(orjson.dumps(self.body)) + text + items)


class ResponseStore:
    """An LRU map ``id -> StoredResponse`` of at most ``capacity`` entries and ``max_bytes``
    of their sizes (event loop only)."""

    def __init__(
        self, capacity: int = DEFAULT_CAPACITY, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity: expected an integer >= 1, got {capacity}")
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, stored: StoredResponse) -> None:
        """Keep ``stored`` (as the most recent); the least recently used go past the bounds (a
        response larger than ``max_bytes`` alone is not kept)."""
        key = stored.body["id"]
        self.delete(key)
        self._items[key] = stored
        self.num_bytes += stored.size
        while len(self._items) > self.capacity or self.num_bytes > self.max_bytes:
            self.num_bytes -= self._items.popitem(last=False)[1].size

    def get(self, response_id: str) -> StoredResponse | None:
        """The response, now the most recently used; None if never kept or evicted."""
        stored = self._items.get(response_id)
        if stored is not None:
            self._items.move_to_end(response_id)
        return stored

    def delete(self, response_id: str) -> bool:
        """Forget the response; whether it was kept."""
        stored = self._items.pop(response_id, None)
        if stored is not None:
            self.num_bytes -= stored.size
        return stored is not None
