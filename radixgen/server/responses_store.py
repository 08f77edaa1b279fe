"""The responses the server keeps for ``previous_response_id`` and ``GET /v1/responses/{id}``.

In memory only, bounded: the ``capacity`` most recently stored or used responses (least
recently used first out). A response keeps its object (what GET answers) and its
conversation as chat messages (the chained input and its own output, without
``instructions``, which OpenAI does not carry to the next turn); a follow-up's conversation
shares the message objects of the earlier one, so a chain costs one reference per message
and turn. A server restart forgets everything.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .protocol import ChatMessage

DEFAULT_CAPACITY = 1024


@dataclass(frozen=True, slots=True)
class StoredResponse:
    body: dict[str, Any]  # the response object
    conversation: tuple[ChatMessage, ...]  # input (with earlier turns) and output


class ResponseStore:
    """An LRU map ``id -> StoredResponse`` of at most ``capacity`` entries (event loop only)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity: expected an integer >= 1, got {capacity}")
        self.capacity = capacity
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, stored: StoredResponse) -> None:
        """Keep ``stored`` (as the most recent); the least recently used goes past capacity."""
        key = stored.body["id"]
        self._items[key] = stored
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        """The response, now the most recently used; None if never kept or evicted."""
        stored = self._items.get(response_id)
        if stored is not None:
            self._items.move_to_end(response_id)
        return stored

    def delete(self, response_id: str) -> bool:
        """Forget the response; whether it was kept."""
        return self._items.pop(response_id, None) is not None
