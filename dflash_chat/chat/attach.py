"""Attaching images to the next message, as oterm does: a `/image PATH` line, a path asked for by a key, or a path
pasted (a file dropped on a terminal pastes its path). The paths as people write them are read here; each image
is then read, checked and stored in a worker (`read_images`: no UI code, it reports through `post`), so a big file
never holds the screen.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from dflash_chat.chat.images import Attachment, ImageStore, Preview, preview_of
from dflash_chat.runtime.image_decode import SVG_SUFFIXES, ImageError, read_file

COMMAND = "/image"
# what a pasted path must end with to be taken for an image (SVG too: it gets the notice that says what to do)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".jfif", *SVG_SUFFIXES)


@dataclass(frozen=True)
class ImageAttached:
    """An image was read and stored; `note`: what the user may want to know ('' for nothing)."""

    image: Attachment
    preview: Preview
    note: str = ""
    typed: bool = False  # named on a /image line


@dataclass(frozen=True)
class ImageRefused:
    """An image that cannot be attached: `error` says why, in one line."""

    path: str
    error: str
    typed: bool = False  # named on a /image line: it goes back into the message box


AttachEvent = ImageAttached | ImageRefused


def is_command(text: str) -> bool:
    """Whether the message box holds /image lines (and so is not a message to send as it is)."""
    return any(_command_rest(line) is not None for line in text.splitlines())


def command_paths(text: str) -> tuple[list[str], str]:
    """(the paths of the text's /image lines, the text without them). A line's paths are shell-quoted
    (`/image "my cat.png" dog.jpg`); a line that names one existing file as it is, spaces and all, is that file.
    A /image line without a path is a ValueError that says how to write one."""
    paths: list[str] = []
    rest: list[str] = []
    for line in text.splitlines():
        arguments = _command_rest(line)
        if arguments is None:
            rest.append(line)
            continue
        if not arguments:
            raise ValueError(f"{COMMAND} needs a path: {COMMAND} PATH (quote a path with spaces)")
        paths += typed_paths(arguments)
    return paths, "\n".join(rest).strip("\n")


def _command_rest(line: str) -> str | None:
    stripped = line.strip()
    if stripped == COMMAND or stripped.startswith(COMMAND + " "):
        return stripped[len(COMMAND) :].strip()
    return None


def typed_paths(arguments: str) -> list[str]:
    """Paths as typed: shell-quoted, or one existing file's path as it is (spaces and all)."""
    if _exists(arguments):
        return [arguments]
    try:
        return shlex.split(arguments)
    except ValueError:  # an unclosed quote: the line as it is (its error names it)
        return [arguments]


def pasted_paths(text: str) -> list[str] | None:
    """The image files a paste names, when the whole paste is paths of existing image files (a terminal's
    drag and drop: quoted or with escaped spaces, or file:// URLs), else None: the paste is text."""
    text = text.strip()
    if not text or len(text) > 4096:
        return None
    if _is_image_file(_from_url(text)):
        return [_from_url(text)]
    try:
        paths = [_from_url(word) for word in shlex.split(text)]
    except ValueError:  # an unclosed quote: text
        return None
    return paths if paths and all(_is_image_file(p) for p in paths) else None


def _from_url(text: str) -> str:
    if text.startswith("file://"):
        return unquote(urlparse(text).path)
    return text


def _exists(text: str) -> bool:
    try:
        return Path(text).expanduser().is_file()
    except (OSError, ValueError):
        return False


def _is_image_file(text: str) -> bool:
    return text.lower().endswith(IMAGE_SUFFIXES) and _exists(text)


def read_images(paths: list[str], store: ImageStore, post: Callable[[AttachEvent], None], typed: bool) -> None:
    """A worker body: each image read, checked and stored, then posted as ImageAttached or ImageRefused."""
    for path in paths:
        name = Path(path).expanduser().name or path
        try:
            image, decoded, note = store.add(read_file(path), name)
            preview = preview_of(decoded.image)
        except ImageError as exc:
            post(ImageRefused(path, str(exc), typed))
        except Exception as exc:  # noqa: BLE001 - a file the checks missed must not take the app down
            post(ImageRefused(path, f"{name} cannot be attached ({type(exc).__name__}: {exc})", typed))
        else:
            post(ImageAttached(image, preview, note, typed))
