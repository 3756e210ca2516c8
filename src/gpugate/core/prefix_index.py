"""The approximate prefix index: which endpoint has probably cached which prompt prefix.

No engine change is needed (llm-d's "approximate prefix" idea): the gateway renders each prompt
canonically (:func:`prompt_text`), cuts it into blocks of ``block_chars`` characters and names each
block by a hash chained over every block before it (:func:`block_hashes`), so one hash stands for
the whole prefix up to its end. When a request is sent, the endpoint is remembered for each of its
block hashes (:meth:`PrefixIndex.record`); a later request's match on an endpoint is the longest
run of its *leading* blocks seen there (:meth:`PrefixIndex.match`) — a shared system prompt, the
previous turns of a chat, an agent's growing transcript.

Bounded: at most ``max_blocks`` hashes per model, least recently used first out, each remembering
at most :data:`MAX_ENDPOINTS_PER_BLOCK` endpoints. The hash is Python's own (SipHash, keyed per
process), so a client cannot aim collisions at it; the index lives in one replica's memory and a
restart forgets it (the engines' caches outlive it, the index relearns in a few requests).
The chained hashes of a recent first message (a shared system prompt) are kept, at most
:data:`HEAD_CACHE` of up to :data:`HEAD_CACHE_CHARS` characters, so that most requests do not
hash it block by block again.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any

#: Endpoints remembered per block: the newest few (a prefix on more endpoints than this is common
#: enough that any of them will do).
MAX_ENDPOINTS_PER_BLOCK = 4


def prompt_text(doc: Mapping[str, Any] | None) -> str | None:
    """A request body's prompt rendered canonically: each chat message as ``role`` NUL content
    (text parts joined) RS, or a completion's string prompt. None when there is none to index."""
    parts = prompt_parts(doc)
    return None if parts is None else "".join(parts)


def prompt_parts(doc: Mapping[str, Any] | None) -> list[str] | None:
    """:func:`prompt_text` before the join: one rendered string per message (or the prompt)."""
    if doc is None:
        return None
    messages = doc.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        for message in messages:
            if not isinstance(message, dict):
                return None
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(f"{message.get('role', '')}\x00{content or ''}\x1e")
        return parts
    prompt = doc.get("prompt")
    return [prompt] if isinstance(prompt, str) else None


def block_hashes(text: str, block_chars: int) -> list[int]:
    """The chained hash of each full block of ``text`` (a partial last block is not hashed)."""
    return _chain(text, block_chars, [])


def _chain(text: str, block_chars: int, hashes: list[int]) -> list[int]:
    """:func:`block_hashes` continued after ``hashes``, the leading blocks of a prompt whose
    text after them is ``text``."""
    previous = hashes[-1] if hashes else 0
    append = hashes.append
    for start in range(0, len(text) - block_chars + 1, block_chars):
        previous = hash((previous, text[start : start + block_chars]))
        append(previous)
    return hashes


_NOBODY = (None,)  # what a block nobody received holds, for the C-speed fast path of record
_LAST = itemgetter(-1)

#: Leading messages (a shared system prompt) whose block hashes are kept, and the longest kept:
#: at most 64 x 64 Ki characters per index.
HEAD_CACHE = 64
HEAD_CACHE_CHARS = 65_536


class PrefixIndex:
    """Block hash → the endpoints (urls) that received it, per model; bounded, LRU."""

    def __init__(self, block_chars: int = 256, max_blocks: int = 200_000) -> None:
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        self._models: dict[str, OrderedDict[int, tuple[str, ...]]] = {}
        self._heads: OrderedDict[tuple[int, str], tuple[str, tuple[int, ...]]] = OrderedDict()

    def __repr__(self) -> str:
        blocks = sum(len(m) for m in self._models.values())
        return f"<PrefixIndex models={len(self._models)} blocks={blocks}>"

    def __len__(self) -> int:
        return sum(len(m) for m in self._models.values())

    def hashes(self, doc: Mapping[str, Any] | None) -> list[int]:
        """The prompt's block hashes. A first message that holds whole blocks (the system
        prompt most requests share) has its blocks' hashes looked up — one compare of the string
        instead of a Python step per block — then the chain goes on over the rest: the same
        hashes as :func:`block_hashes` of the whole text."""
        parts = prompt_parts(doc)
        if parts is None:
            return []
        size = self.block_chars
        head = parts[0]
        if not size <= len(head) <= HEAD_CACHE_CHARS:
            return _chain("".join(parts), size, [])
        # Keyed by its length and first block (cheap to hash), the whole text compared on a hit:
        # a miss costs next to nothing, a hit one memcmp instead of a hash step per block.
        key = (len(head), head[:size])
        heads = self._heads
        entry = heads.get(key)
        if entry is None or entry[0] != head:  # hashed as before; its leading blocks kept
            hashes = _chain("".join(parts), size, [])
            heads[key] = (head, tuple(hashes[: len(head) // size]))
            heads.move_to_end(key)
            if len(heads) > HEAD_CACHE:
                heads.popitem(last=False)
            return hashes
        heads.move_to_end(key)
        known = entry[1]
        hashes = list(known)
        if len(parts) == 1:
            return hashes
        parts[0] = head[len(known) * size :]  # the rest of its last, partial block
        return _chain("".join(parts), size, hashes)

    def match(self, model: str, hashes: Sequence[int]) -> dict[str, int]:
        """Per endpoint url, how many leading blocks of ``hashes`` it received (absent: 0)."""
        blocks = self._models.get(model)
        if not blocks or not hashes:
            return {}
        held = list(map(blocks.get, hashes))
        first = held[0]
        if first is not None and held.count(first) == len(held):  # the usual case, in C
            return dict.fromkeys(first, len(held))
        runs: dict[str, int] = {}
        alive: tuple[str, ...] = ()
        depth = 0
        for depth, holders in enumerate(held):
            if holders is None:
                break
            if holders == alive:  # the usual case: the same endpoints hold the next block
                continue
            here = holders if depth == 0 else tuple(u for u in alive if u in holders)
            for url in alive:
                if url not in here:
                    runs[url] = depth
            if not here:
                return runs
            alive = here
        else:
            depth = len(hashes)
        for url in alive:
            runs[url] = depth
        return runs

    def record(self, model: str, hashes: Sequence[int], url: str) -> None:
        """``url`` has received a prompt with these block hashes (it will cache them)."""
        if not hashes:
            return
        blocks = self._models.get(model)
        if blocks is None:
            blocks = self._models[model] = OrderedDict()
        get, move = blocks.get, blocks.move_to_end
        lasts = list(map(_LAST, map(get, hashes, repeat(_NOBODY))))
        if lasts.count(url) == len(lasts):  # every block was last sent there: only the LRU moves
            deque(map(move, hashes), maxlen=0)
            return
        alone = (url,)  # one tuple shared by every block only ``url`` holds
        for h in hashes:
            holders = get(h)
            if holders is None:
                blocks[h] = alone
            elif holders[-1] == url:  # the usual case: it was sent there last
                move(h)
            else:
                kept = tuple(u for u in holders if u != url)[-(MAX_ENDPOINTS_PER_BLOCK - 1) :]
                blocks[h] = (*kept, url) if kept else alone
                move(h)
        while len(blocks) > self.max_blocks:
            blocks.popitem(last=False)

    def forget(self, url: str) -> None:
        """``url`` left the fleet (or restarted): drop it from every block."""
        for blocks in self._models.values():
            for h in [h for h, holders in blocks.items() if url in holders]:
                left = tuple(u for u in blocks[h] if u != url)
                if left:
                    blocks[h] = left
                else:
                    del blocks[h]
