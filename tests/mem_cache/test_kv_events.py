"""KV cache events: applying the stored/removed/cleared events gives exactly the whole blocks
the radix tree holds (every insert, eviction and reset), the log resets a reader that fell
behind, and the router's view of a worker (``Worker.apply_kv_events``) and ``PromptKeys``
name a prompt's blocks as the worker stores them."""

from __future__ import annotations

import random
import time

import orjson
import torch

from radixgen.mem_cache.kv_blocks import BLOCK_TOKENS, block_hashes
from radixgen.mem_cache.kv_events import KVEventLog
from radixgen.mem_cache.memory_pool import SlotAllocator
from radixgen.mem_cache.radix_cache import RadixCache, salt_offset, salted_key
from radixgen.router.policy import Policy, Worker


def tree_blocks(cache: RadixCache) -> set[str]:
    """The names of every whole block the tree holds (a block is held when its last token is)."""
    names = set()
    for node in cache._nodes():
        key, _ = cache._path(node)
        start = len(key) - len(node.key)
        first, last = start // BLOCK_TOKENS, len(key) // BLOCK_TOKENS
        names.update(n.hex() for n in block_hashes(key, last)[first:])
    return names


def test_events_replay_to_the_trees_blocks():
    rng = random.Random(0)
    allocator = SlotAllocator(600)
    cache = RadixCache(allocator)
    cache.events = log = KVEventLog()
    reader = Worker("w")
    prefixes = [[rng.randrange(1, 50) for _ in range(rng.randrange(20, 90))] for _ in range(4)]
    for step in range(300):
        op = rng.random()
        if op < 0.6:
            ids = rng.choice(prefixes) + [rng.randrange(1, 50) for _ in range(rng.randrange(0, 70))]
            if rng.random() < 0.3:
                ids = salted_key(ids, salt_offset("t"))
            _, node = cache.match_prefix(ids)
            cache.lock(node)
            slots = allocator.alloc(len(ids)) if allocator.num_free >= len(ids) else None
            if slots is None:
                cache.evict(len(ids))
                slots = allocator.alloc(len(ids))
            if slots is not None:
                cached = cache.insert(ids, slots)
                allocator.free(slots[:cached])
            cache.unlock(node)
        elif op < 0.95:
            cache.evict(rng.randrange(1, 120))
        else:
            cache.reset()
        events, last, reset = log.since(reader.kv_seq)
        assert not reset
        reader.apply_kv_events({"events": [e.as_dict() for e in events], "last": last})
        assert reader.kv_blocks == tree_blocks(cache), step
    cache.check_integrity()


def test_a_reader_behind_the_log_is_reset():
    log = KVEventLog(capacity=4)
    key = list(range(4 * BLOCK_TOKENS))
    for _ in range(6):
        log.stored(key, 0)
    events, last, reset = log.since(1)
    assert reset and last == 6 and [e.seq for e in events] == [3, 4, 5, 6]
    assert log.since(6) == ([], 6, False)
    assert log.since(99)[2]  # a number from before the worker restarted


def test_block_matches_route_to_the_worker_holding_them():
    names = [f"{i:032x}" for i in range(6)]
    a, b = Worker("a"), Worker("b")
    a.apply_kv_events({"events": [{"type": "stored", "blocks": names[:2]}], "last": 1})
    b.apply_kv_events({"events": [{"type": "stored", "blocks": names[:5]}], "last": 1})
    b.tree.insert("x" * 100)
    a.tree.insert("the text of this request, sent to a before")  # the text tree would say a
    policy = Policy([a, b])
    assert policy.choose("the text of this request, sent to a before", blocks=names) is b
    b.apply_kv_events({"events": [{"type": "removed", "blocks": names[:5]}], "last": 2})
    assert b.held_blocks(names) == 0 and a.held_blocks(names) == 2
    # a worker whose blocks are unknown: the text tree decides for everyone
    c = Worker("c")
    assert Policy([a, c]).choose("the text of this request, sent to a before", blocks=names) is a


def test_prompt_keys_name_the_blocks_the_worker_stores(tiny_model_folder):
    from radixgen import Engine, SamplingParams
    from radixgen.router.prompt_keys import PromptKeys

    engine = Engine(str(tiny_model_folder), enable_kv_events=True, max_total_tokens=4096)
    try:
        keys = PromptKeys(engine.tokenizer, engine.formats)
        text = "A question about lanterns and harbors, asked at some length. " * 6
        messages = [
            {"role": "system", "content": "Be brief. " * 20},
            {"role": "user", "content": "Hi"},
        ]
        chat = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        engine.generate([text, chat], SamplingParams(max_new_tokens=2))
        engine.generate([text], SamplingParams(max_new_tokens=2, cache_salt="s"))
        events, _, _ = engine.kv_events.since(0)
        stored = {n for e in events if e.kind == "stored" for n in e.blocks}
        for path, body in [
            ("/generate", {"text": text}),
            ("/v1/completions", {"prompt": text}),
            ("/generate", {"text": text, "cache_salt": "s"}),
            ("/v1/chat/completions", {"model": "m", "messages": messages}),
        ]:
            names = keys.names(path, orjson.dumps(body))
            assert names and set(names) <= stored, (path, body)
        assert keys.names("/generate", orjson.dumps({"text": text, "lora_path": "a"})) is None
        assert keys.names("/v1/responses", orjson.dumps({"input": text})) is None
        assert keys.names("/generate", b"not json") is None
    finally:
        engine.shutdown()
    assert torch.is_tensor(torch.zeros(1))


def test_a_flush_seen_late_keeps_the_requests_routed_after_it():
    """The router flushes, routes a request to ``a`` and only then polls the flush's event:
    the request's blocks stay expected on ``a``, and the next request sharing them follows."""
    names = [f"{i:032x}" for i in range(4)]
    a, b = Worker("a"), Worker("b")
    for w in (a, b):
        w.apply_kv_events({"events": [], "last": 0, "reset": True}, sent_at=time.monotonic())
    policy = Policy([a, b])
    assert policy.choose("first", blocks=names) is a  # both empty: the first in line
    # the poll after the request was routed brings the flush that came before it
    a.apply_kv_events({"events": [{"type": "cleared"}], "last": 1}, sent_at=time.monotonic())
    assert a.held_blocks(names) == 4
    assert policy.choose("second", blocks=names) is a
    # a flush in a later poll's answer cancels what was expected before the previous poll
    a.apply_kv_events({"events": [], "last": 1}, sent_at=time.monotonic())
    a.apply_kv_events({"events": [{"type": "cleared"}], "last": 2}, sent_at=time.monotonic())
    assert a.held_blocks(names) == 0
