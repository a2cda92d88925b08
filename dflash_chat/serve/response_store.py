"""The responses a later request may continue (Responses' `previous_response_id`): in memory only, bounded twice, by
their number (KEPT_RESPONSES) and by the bytes of the images they hold (MAX_IMAGE_BYTES, all of them together).

A stored response holds its whole conversation, so its images are the part that can be large: a request's text fits
the model's context once it was answered, but an image's file may be megabytes whatever its tokens (it is resized into
the tower's budget). Each image is held once, by its content hash (the SHA-256 of its bytes that serve/images.py took
when it decoded the image for the answer, as runtime/image_decode.py names an image), however many responses hold
it: each response of a conversation continued by id holds every image before it, and Codex sends the same screenshot
again. It is held as the request sent it (a data URL's text, counted by its length; an http(s) URL is its own entry,
fetched again when continued), so storing and continuing cost no decoding. Past either bound the least recently
stored or continued responses are dropped whole, with the images no other response holds; a response whose own
images are over MAX_IMAGE_BYTES is not kept (nor is any other dropped for it).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dflash_chat.runtime.prompt import Turn
from dflash_chat.serve.images import ImageSource

KEPT_RESPONSES = 256
MAX_IMAGE_BYTES = 256 * 2**20


@dataclass(frozen=True)
class _Held:
    """An image part as stored: its entry's key, and the request field that named it."""

    key: str
    where: str


def _key(source: ImageSource) -> str:
    """A data URL's entry is its image's content hash (serve decoded it for the answer); any other URL's, its text."""
    digest = source.read.get("digest")
    if digest and source.url[:5].lower() == "data:":
        return digest
    return "url:" + hashlib.sha256(source.url.encode()).hexdigest()


class ResponseStore:
    """Responses by id, their images held once each by content; thread-safe (the event loop stores and reads them)."""

    def __init__(self, max_responses: int = KEPT_RESPONSES, max_image_bytes: int = MAX_IMAGE_BYTES) -> None:
        self.max_responses = max_responses
        self.max_image_bytes = max_image_bytes
        self._responses: OrderedDict[str, tuple[list[Turn], frozenset[str]]] = OrderedDict()  # id -> turns, keys
        self._images: dict[str, str] = {}  # key -> the image's URL as a request sent it
        self._holders: dict[str, int] = {}  # key -> how many stored responses hold the image
        self.image_bytes = 0  # of the images held, each counted once
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._responses)

    def remember(self, response_id: str, turns: list[Turn]) -> None:
        """Keep a response's conversation; the oldest go while either bound is passed. One whose own images are over
        the byte bound is not kept, and drops nothing."""
        entries: dict[str, str] = {}
        stored = [_stored_turn(turn, entries) for turn in turns]
        with self._lock:
            self._drop(response_id)
            if sum(map(len, entries.values())) > self.max_image_bytes:
                return  # it could only be kept by dropping every other, and then itself
            for key, url in entries.items():
                if key not in self._images:
                    self._images[key] = url
                    self.image_bytes += len(url)
                self._holders[key] = self._holders.get(key, 0) + 1
            self._responses[response_id] = (stored, frozenset(entries))
            while self._responses and (
                len(self._responses) > self.max_responses or self.image_bytes > self.max_image_bytes
            ):
                self._drop(next(iter(self._responses)))

    def recall(self, response_id: str) -> list[Turn] | None:
        """The response's turns, its images as a request sent them, or None when it is not kept; a response
        continued counts as recently stored."""
        with self._lock:
            kept = self._responses.get(response_id)
            if kept is None:
                return None
            self._responses.move_to_end(response_id)
            images = {key: self._images[key] for key in kept[1]}
        return [_sent_turn(turn, images) for turn in kept[0]]

    def _drop(self, response_id: str) -> None:
        kept = self._responses.pop(response_id, None)
        for key in kept[1] if kept is not None else ():
            self._holders[key] -= 1
            if not self._holders[key]:
                del self._holders[key]
                self.image_bytes -= len(self._images.pop(key))


def _stored_turn(turn: Turn, entries: dict[str, str]) -> Turn:
    """The turn with each image source replaced by its entry's key (the entry put in `entries`)."""
    return _with_images(turn, ImageSource, lambda source: _store(source, entries))


def _store(source: ImageSource, entries: dict[str, str]) -> _Held:
    key = _key(source)
    entries.setdefault(key, source.url)
    return _Held(key, source.where)


def _sent_turn(turn: Turn, images: dict[str, str]) -> Turn:
    return _with_images(turn, _Held, lambda held: ImageSource(images[held.key], held.where))


def _with_images(turn: Turn, kind: type, convert: Callable[[Any], Any]) -> Turn:
    """The turn with each image part of `kind` converted; a turn without one is the same object."""
    content = turn.get("content")
    if not isinstance(content, list) or not any(isinstance(p.get("image"), kind) for p in content):
        return turn
    parts = [
        {**part, "image": convert(part["image"])} if isinstance(part.get("image"), kind) else part for part in content
    ]
    return {**turn, "content": parts}
