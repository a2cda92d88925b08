"""Images people hand to dflash-chat, decoded for the vision tower: bytes, a file or a data URL in, an RGB Pillow
image out, or an `ImageError` whose one line says what is wrong and what to do (the chat shows it as a notice,
serve as a 400).

What is refused: what is not an image, an image cut short, SVG (the tower reads pixels, and rendering SVG is a
browser's job), a decompression bomb (more than MAX_PIXELS pixels; Pillow's own warning and error caught), an
image more than MAX_ASPECT times as long as it is wide (the reference processor refuses those). What is converted:
CMYK, 16-bit and palette images to 8-bit RGB, transparency laid over white as the reference's `convert_to_rgb`
does; the EXIF orientation is applied; of an animated image the first frame is taken, and `Decoded.note` says so.
The pixel budget is not applied here: engine/models/vision_input.py resizes to it, as the reference does.

Pillow and numpy only: no torch at import (the UI and serve decode before anything loads).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

MAX_BYTES = 32 * 2**20  # an image file or data URL's decoded bytes
MAX_PIXELS = 2**27  # 134 M pixels (16384 x 8192): a 108 MP phone photo passes, a 50k x 50k bomb does not
MAX_ASPECT = 200  # as engine/models/vision_input.py's: the reference refuses images longer than this
SVG_SUFFIXES = (".svg", ".svgz")
_DATA_URL = re.compile(r"^data:(?P<mime>[^;,]*)(?P<params>(;[^;,]*)*),", re.IGNORECASE)


class ImageError(ValueError):
    """An image that cannot be given to the model; the message is one line saying what to do."""


@dataclass(frozen=True)
class Decoded:
    """An image ready for engine/models/vision_input.py: 8-bit RGB, upright."""

    image: object  # a PIL.Image.Image in mode "RGB"
    digest: str  # sha256 of the bytes as given: the image's identity (history, prefix reuse)
    format: str  # what Pillow read it as ("PNG", "JPEG", ...)
    note: str = ""  # what was done that the user may want to know (an animation's first frame taken)

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size  # type: ignore[attr-defined]


def decode_file(path: str | Path) -> Decoded:
    """The image in a file; ImageError for a missing, unreadable, oversized or bad one."""
    path = Path(path).expanduser()
    return decode_bytes(read_file(path), path.name or str(path))


def read_file(path: str | Path) -> bytes:
    """An image file's bytes, as `decode_bytes` takes them; ImageError for a missing, unreadable or oversized one."""
    path = Path(path).expanduser()
    name = path.name or str(path)
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise ImageError(f"{path} is a folder, not an image: give the image file's path")
        if size > MAX_BYTES:
            raise ImageError(_too_many_bytes(name, size))
        return path.read_bytes()
    except FileNotFoundError:
        raise ImageError(f"{path}: no such file; check the path") from None
    except PermissionError:
        raise ImageError(f"{path}: permission denied; make the file readable") from None
    except OSError as exc:
        raise ImageError(f"{path} cannot be read ({exc.strerror or exc}); check the path") from None


def decode_data_url(url: str, name: str = "the image") -> Decoded:
    """A `data:image/...;base64,...` URL (OpenAI's `image_url`), its size checked before it is decoded."""
    match = _DATA_URL.match(url)
    if match is None:
        raise ImageError(f"{name} is not a data URL (data:image/png;base64,...): send the image base64-encoded")
    mime = match["mime"].strip().lower()
    params = [p.strip().lower() for p in match["params"].split(";") if p.strip()]
    if mime.startswith("image/svg"):
        raise ImageError(_svg(name))
    if mime and not mime.startswith("image/"):
        raise ImageError(f"{name} is a data URL of {mime}, not an image: send a PNG, JPEG, GIF or WebP")
    if "base64" not in params:
        raise ImageError(f"{name} is a data URL without ;base64: send the image base64-encoded")
    payload = re.sub(r"\s+", "", url[match.end() :])
    if len(payload) * 3 // 4 > MAX_BYTES:
        raise ImageError(_too_many_bytes(name, len(payload) * 3 // 4))
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"{name}: the data URL's base64 is damaged; encode the image again") from None
    return decode_bytes(data, name)


def decode_bytes(data: bytes, name: str = "the image") -> Decoded:
    """The image in `data`; ImageError for anything that is not a whole, readable, reasonably sized image."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise ImageError(f"{name} is empty (0 bytes): attach the image again")
    if len(data) > MAX_BYTES:
        raise ImageError(_too_many_bytes(name, len(data)))
    if _looks_like_svg(data):
        raise ImageError(_svg(name))
    digest = hashlib.sha256(data).hexdigest()
    try:
        with warnings.catch_warnings():
            # our own MAX_PIXELS check below decides; Pillow's warning would only print
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            fmt = image.format or "image"
            _check_size(image.size, name)
            frames = getattr(image, "n_frames", 1)
            if frames > 1:
                image.seek(0)
            image.load()
    except ImageError:
        raise
    except UnidentifiedImageError:
        if name.lower().endswith(SVG_SUFFIXES):  # an SVG whose start the sniffing missed (a long comment, say)
            raise ImageError(_svg(name)) from None
        raise ImageError(
            f"{name} is not an image this app reads (PNG, JPEG, GIF, WebP, BMP, TIFF): convert it to PNG"
        ) from None
    except Image.DecompressionBombError:
        raise ImageError(_too_many_pixels(name)) from None
    except (OSError, ValueError, SyntaxError, EOFError, IndexError) as exc:  # Pillow's words for a damaged file
        raise ImageError(f"{name} is damaged or cut short ({_reason(exc)}): save or download it again") from None
    note = f"{name} is an animated {fmt} of {frames} frames: its first frame is used" if frames > 1 else ""
    return Decoded(_rgb(_upright(image)), digest, fmt, note)


def _check_size(size: tuple[int, int], name: str) -> None:
    width, height = size
    if width < 1 or height < 1:
        raise ImageError(f"{name} has no pixels ({width} x {height}): attach another image")
    if width * height > MAX_PIXELS:
        raise ImageError(_too_many_pixels(name, width, height))
    if max(width, height) / min(width, height) > MAX_ASPECT:
        raise ImageError(
            f"{name} is {width} x {height}, more than {MAX_ASPECT} times as long as it is wide, which the model "
            "cannot read: crop it"
        )


def _upright(image):
    """The image as it is meant to be seen: its EXIF orientation applied (a broken EXIF block is ignored)."""
    from PIL import ImageOps

    try:
        return ImageOps.exif_transpose(image) or image
    except (OSError, ValueError, KeyError, TypeError, SyntaxError):
        return image


def _rgb(image):
    """8-bit RGB: transparency laid over white (the reference's convert_to_rgb), 16-bit and 32-bit greys scaled
    to 8 bits (Pillow's own conversion clips them), every other mode (CMYK, palette, YCbCr, 1-bit) converted."""
    import numpy as np
    from PIL import Image

    if image.mode.startswith("I;16") or image.mode == "I":
        grey = np.asarray(image, dtype=np.float64)
        scale = 65535.0 if grey.max(initial=0) > 255 or image.mode.startswith("I;16") else 255.0
        image = Image.fromarray(np.clip(np.rint(grey * (255.0 / scale)), 0, 255).astype(np.uint8), "L")
    elif image.mode == "F":
        image = Image.fromarray(np.clip(np.rint(np.asarray(image)), 0, 255).astype(np.uint8), "L")
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


def _looks_like_svg(data: bytes) -> bool:
    head = data[:1024].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if head.startswith(b"\x1f\x8b"):  # .svgz is gzip; Pillow reads no gzip images, so say what it is if it is
        import gzip

        try:
            with gzip.open(io.BytesIO(data)) as unzipped:
                head = unzipped.read(1024).lstrip().lower()
        except (OSError, EOFError):
            return False
    return head.startswith(b"<svg") or (head.startswith((b"<?xml", b"<!doctype svg", b"<!--")) and b"<svg" in head)


def _svg(name: str) -> str:
    return f"{name} is an SVG drawing, which the model cannot read (it reads pixels): export it as PNG and attach that"


def _too_many_bytes(name: str, size: int) -> str:
    return f"{name} is {size / 2**20:.1f} MiB; images up to {MAX_BYTES // 2**20} MiB are read: save it smaller"


def _too_many_pixels(name: str, width: int = 0, height: int = 0) -> str:
    dims = f" ({width} x {height})" if width else ""
    return (
        f"{name} has too many pixels{dims} to decode safely (at most {MAX_PIXELS // 10**6} million): scale it "
        "down and attach it again"
    )


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:120]
