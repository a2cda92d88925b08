"""A chat's images: what a message holds of each (`Attachment`: its content hash, name and size) and where the
bytes live (`ImageStore`: one file per image in the data folder, named by its SHA-256, written once and atomically,
so a chat's history row only references the hash and the same image attached twice is stored once).

An answer's worker turns a turn's attachments into what its backend sends: Pillow images for the engine in this
process (decoded once and kept for the next turns, so the prompt's images stay the same objects and its prefix is
reused), data URLs for a server. Pillow only, imported when an image is read: no torch.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dflash_chat.errors import UserError
from dflash_chat.runtime.image_decode import Decoded, ImageError, decode_bytes

KEPT_DECODED = 16  # decoded images kept for the next turns of a chat (the oldest used first out)
SUFFIXES = {"PNG": "png", "JPEG": "jpg", "GIF": "gif", "WEBP": "webp", "BMP": "bmp", "TIFF": "tif", "MPO": "jpg"}


@dataclass(frozen=True)
class Attachment:
    """An image a message holds: its bytes are in the ImageStore under `digest`."""

    digest: str  # sha256 of the file's bytes, hex
    name: str  # the file's name when it was attached
    width: int
    height: int
    size: int  # bytes
    format: str  # as Pillow read it: "PNG", "JPEG", ...

    @property
    def suffix(self) -> str:
        return SUFFIXES.get(self.format.upper(), "img")

    @property
    def file_name(self) -> str:
        """The stored file's name: the hash, and the format's usual suffix so other programs open it."""
        return f"{self.digest}.{self.suffix}"

    @property
    def mime(self) -> str:
        return f"image/{'jpeg' if self.suffix == 'jpg' else self.suffix}"

    def chip(self) -> str:
        """'cat.png · 640×480' as the message box and the chat show it."""
        return f"{self.name} · {self.width}×{self.height}"

    def reference(self) -> str:
        """The image in words, where it cannot be shown: its name, size and a short hash."""
        return f"{self.name} ({self.width}×{self.height}, sha256 {self.digest[:12]})"


PREVIEW_CELLS = (8, 2)  # the most columns and rows a chip's preview takes: 8 x 4 half-block pixels
CELL_PIXELS = (20, 40)  # the most pixels a terminal cell is wide and high (a 2x screen's): a thumbnail's cell


@dataclass(frozen=True)
class Preview:
    """What a chip shows of an image (ui/widgets/image_preview.py): `cells`, rows of RGB pixels (an even number,
    two to a half-block cell); and `thumbnail`, a small RGB Pillow image of the same aspect, for a terminal that draws
    images (as many cells, each up to CELL_PIXELS)."""

    cells: tuple[tuple[tuple[int, int, int], ...], ...]
    thumbnail: Any

    @property
    def columns(self) -> int:
        return len(self.cells[0])

    @property
    def rows(self) -> int:
        return len(self.cells) // 2


def preview_of(image, cells: tuple[int, int] = PREVIEW_CELLS) -> Preview:
    """A Pillow image as a preview of at most `cells` (columns, rows) of half-block cells (two pixels each, about
    square), its aspect kept. The attaching worker makes it, so the UI thread never resizes a large image."""
    from PIL import Image

    columns, rows = cells
    width, height = image.size
    scale = min(columns / max(width, 1), rows * 2 / max(height, 1))
    across = max(1, round(width * scale))
    down = max(2, min(rows * 2, round(height * scale / 2) * 2))
    rgb = image if image.mode == "RGB" else image.convert("RGB")  # decoded images are RGB: no copy of a large one
    small = rgb.resize((across, down), Image.Resampling.BOX)
    raw = small.tobytes()
    pixels = [(raw[i], raw[i + 1], raw[i + 2]) for i in range(0, len(raw), 3)]
    fit = min(1.0, across * CELL_PIXELS[0] / max(width, 1), down // 2 * CELL_PIXELS[1] / max(height, 1))
    size = (max(1, round(width * fit)), max(1, round(height * fit)))
    thumbnail = rgb.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
    return Preview(tuple(tuple(pixels[y * across : (y + 1) * across]) for y in range(down)), thumbnail)


def attachments_to_json(images: tuple[Attachment, ...]) -> str | None:
    return json.dumps([asdict(image) for image in images], ensure_ascii=False) if images else None


def attachments_from_json(text: str | None) -> tuple[Attachment, ...]:
    """A message's saved images; entries that cannot be read back (hand-edited) are left out, the message kept."""
    try:
        items = json.loads(text) if text else []
    except (ValueError, RecursionError):
        return ()
    kinds = Attachment.__annotations__
    found = []
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict) or set(item) != set(kinds):
            continue
        if all(isinstance(item[k], int if kinds[k] == "int" else str) for k in kinds) and _is_digest(item["digest"]):
            found.append(Attachment(**item))
    return tuple(found)


def _is_digest(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


class ImageStore:
    """Image files by content hash in `folder`; decoded images kept for the next turns. Thread-safe: attaching
    and answering read it from workers."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self._decoded: OrderedDict[str, Any] = OrderedDict()  # digest -> RGB Pillow image
        self._unsaved: dict[str, bytes] = {}  # images whose file could not be written: kept for this session
        self._used: set[str] = set()  # attached in this session: a message not yet sent may hold one

    def path(self, image: Attachment) -> Path:
        return self.folder / image.file_name

    def add(self, data: bytes, name: str) -> tuple[Attachment, Decoded, str]:
        """Decode `data` (ImageError: why it cannot be shown) and store it; returns the attachment, the decoded
        image and a note for the user ('' when all went as asked: else a first frame taken, or the file not saved)."""
        decoded = decode_bytes(data, name)
        width, height = decoded.size
        image = Attachment(decoded.digest, name, width, height, len(data), decoded.format)
        note = decoded.note
        with self._lock:
            self._used.add(image.digest)
        try:
            self._write(image, data)
        except OSError as exc:
            with self._lock:
                self._unsaved[image.digest] = data
            why = exc.strerror or str(exc)
            note = f"{name} could not be kept in {self.folder} ({why}): it is sent, but the history will not show it"
        self._keep(image.digest, decoded.image)
        return image, decoded, note

    def _write(self, image: Attachment, data: bytes) -> None:
        """The file written whole or not at all (a temporary file renamed over), once per content."""
        target = self.path(image)
        if target.is_file() and target.stat().st_size == len(data):
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.part")
        try:
            with open(temporary, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)

    def forget(self, digests: set[str]) -> None:
        """Remove the files of images no chat holds any more (a chat was deleted), but those attached in this
        session, which a message not yet sent may hold. A file that cannot be removed is left."""
        with self._lock:
            gone = digests - self._used
        for digest in gone:
            if not _is_digest(digest):
                continue
            for path in self.folder.glob(f"{digest}.*"):
                try:
                    path.unlink(missing_ok=True)
                except OSError:  # a read-only folder: the file stays, nothing refers to it
                    pass

    def data(self, image: Attachment) -> bytes:
        """The image's bytes; ImageError when its file is gone or no longer holds it."""
        with self._lock:
            kept = self._unsaved.get(image.digest)
        if kept is not None:
            return kept
        try:
            return self.path(image).read_bytes()
        except OSError:
            raise ImageError(
                f"the image {image.reference()} is no longer in {self.folder}: attach it again in a new message"
            ) from None

    def decoded(self, image: Attachment) -> Any:
        """The image as the engine takes it (RGB Pillow), decoded once; ImageError when it cannot be read."""
        with self._lock:
            if image.digest in self._decoded:
                self._decoded.move_to_end(image.digest)
                return self._decoded[image.digest]
        decoded = decode_bytes(self.data(image), image.name)
        if decoded.digest != image.digest:
            raise ImageError(f"the stored file of {image.reference()} was changed: attach the image again")
        self._keep(image.digest, decoded.image)
        return decoded.image

    def data_url(self, image: Attachment) -> str:
        """The image as an OpenAI `image_url` takes it."""
        return f"data:{image.mime};base64,{base64.b64encode(self.data(image)).decode('ascii')}"

    def _keep(self, digest: str, image: Any) -> None:
        with self._lock:
            self._decoded[digest] = image
            self._decoded.move_to_end(digest)
            while len(self._decoded) > KEPT_DECODED:
                self._decoded.popitem(last=False)


def engine_turns(turns: list[dict[str, Any]], store: ImageStore) -> list[dict[str, Any]]:
    """The turns as runtime/prompt.py takes them: each attachment's decoded image in its part. An image that cannot
    be read is a UserError that says which."""
    from dflash_chat.runtime.images import image_part

    return _resolved(turns, lambda image: image_part(store.decoded(image)))


def openai_turns(turns: list[dict[str, Any]], store: ImageStore) -> list[dict[str, Any]]:
    """The turns as an OpenAI-compatible server takes them: each attachment an `image_url` part of its data URL."""
    return _resolved(turns, lambda image: {"type": "image_url", "image_url": {"url": store.data_url(image)}})


def _resolved(turns: list[dict[str, Any]], part: Callable[[Attachment], dict[str, Any]]) -> list[dict[str, Any]]:
    """The turns with each attachment part replaced by `part(attachment)`; the other turns are the same objects."""
    resolved = []
    for turn in turns:
        content = turn.get("content")
        if isinstance(content, list) and any(isinstance(p.get("image"), Attachment) for p in content):
            try:
                content = [part(p["image"]) if isinstance(p.get("image"), Attachment) else p for p in content]
            except ImageError as exc:
                raise UserError(str(exc)) from None
            turn = {**turn, "content": content}
        resolved.append(turn)
    return resolved
