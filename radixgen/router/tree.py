"""PrefixTree: what one worker has probably cached, as a radix tree over the request texts it
was sent (characters, not tokens: the router has no tokenizer), trimmed least recently used
first. It approximates the worker's radix cache: the worker evicts on its own, so a match is a
likelihood, which is all routing needs."""

from __future__ import annotations

import heapq
import itertools


class _Node:
    __slots__ = ("children", "last", "parent", "text")

    def __init__(self, text: str, parent: _Node | None, last: int) -> None:
        self.text = text  # the edge into this node
        self.parent = parent
        self.children: dict[str, _Node] = {}
        self.last = last  # the access counter when this node was last on a matched path


class PrefixTree:
    """``match(text)``: characters of ``text``'s longest prefix seen; ``insert(text)``: record
    it. Holds at most ``max_chars`` characters (oldest leaves go first)."""

    def __init__(self, max_chars: int = 1 << 22) -> None:
        self.root = _Node("", None, 0)
        self.max_chars = max_chars
        self.size = 0  # characters held
        self._clock = itertools.count(1)

    def match(self, text: str) -> int:
        node, at = self.root, 0
        while at < len(text):
            child = node.children.get(text[at])
            if child is None:
                break
            common = _common(child.text, text, at)
            at += common
            if common < len(child.text):
                break
            node = child
        return at

    def insert(self, text: str) -> None:
        now = next(self._clock)
        node, at = self.root, 0
        node.last = now
        while at < len(text):
            child = node.children.get(text[at])
            if child is None:
                node.children[text[at]] = _Node(text[at:], node, now)
                self.size += len(text) - at
                break
            common = _common(child.text, text, at)
            if common < len(child.text):  # split the edge where the texts part
                middle = _Node(child.text[:common], node, now)
                node.children[text[at]] = middle
                child.text = child.text[common:]
                child.parent = middle
                middle.children[child.text[0]] = child
                child = middle
            child.last = now
            at += common
            node = child
        if self.size > self.max_chars:
            self._trim(self.max_chars * 9 // 10)

    def _trim(self, target: int) -> None:
        """Drop least recently used leaves until at most ``target`` characters remain."""
        leaves = [
            (n.last, id(n), n) for n in self._nodes() if not n.children and n is not self.root
        ]
        heapq.heapify(leaves)
        while self.size > target and leaves:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.text[0]]
            self.size -= len(leaf.text)
            if parent is not self.root and not parent.children:
                heapq.heappush(leaves, (parent.last, id(parent), parent))

    def _nodes(self) -> list[_Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out


def _common(edge: str, text: str, at: int) -> int:
    """Length of the common prefix of ``edge`` and ``text[at:]``."""
    n = min(len(edge), len(text) - at)
    i = 0
    while i < n and edge[i] == text[at + i]:
        i += 1
    return i
