"""Images in requests: each dialect's image part read into an `ImageSource` (where the image is, and which field
named it), and a request's sources turned into the Pillow images its prompt shows.

A data URL is decoded by runtime/image_decode.py, which refuses what is not a whole, readable, reasonably sized image
in one line (a 400 here, naming the field). An http(s) URL is fetched only when the server was started with
`--allow-image-urls` (the server would otherwise reach any address a client names, its own network's included),
within FETCH_TIMEOUT_S and image_decode's MAX_BYTES; without the flag it is a 400 that says how to send the image.
The prompt's images are keyed by their content (engine/images.py), so the same image sent again, inline or by URL,
continues the conversation the engine holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dflash_chat.runtime.image_decode import MAX_BYTES, ImageError, decode_bytes, decode_data_url
from dflash_chat.runtime.images import image_part
from dflash_chat.runtime.prompt import Turn
from dflash_chat.serve.errors import bad_request

FETCH_TIMEOUT_S = 10.0  # an image URL's whole download
MAX_REDIRECTS = 3
URL_SCHEMES = ("data:", "http://", "https://")


@dataclass(frozen=True)
class ImageSource:
    """An image a request names: a data URL or an http(s) URL, and the request's field that holds it. `read` holds
    the SHA-256 of the image's bytes ("digest", as runtime/image_decode.py names an image) once `shown` has decoded
    it, so what keeps the request (serve/response_store.py) never reads the image again."""

    url: str
    where: str
    read: dict[str, str] = field(default_factory=dict, compare=False, repr=False)


def source_part(url: Any, where: str) -> dict[str, Any]:
    """A turn's image part for the URL a request gave at `where`: a data URL or an http(s) URL, else a 400."""
    if not isinstance(url, str) or not url.strip():
        raise bad_request(f"'{where}' must be the image's URL: a data:image/...;base64 URL, or http(s).", where)
    url = url.strip()
    if not url.lower().startswith(URL_SCHEMES):
        raise bad_request(
            f"'{where}' is not a data: or http(s) URL: send the image inline as data:image/png;base64,...", where
        )
    return {"type": "image", "image": ImageSource(url, where)}


def sources(turns: list[Turn]) -> list[ImageSource]:
    """The image sources of the turns' parts, in order."""
    return [
        part["image"]
        for turn in turns
        if isinstance(turn.get("content"), list)
        for part in turn["content"]
        if isinstance(part, dict) and isinstance(part.get("image"), ImageSource)
    ]


def shown(turns: list[Turn], allow_urls: bool, fetch: Callable[[str, str], bytes] | None = None) -> list[Turn]:
    """The turns with each image source decoded into a Pillow image part (runtime/images.py); a source that cannot be
    shown is a 400 naming its field. `fetch(url, where)`: an http(s) URL's bytes (default: `fetch_url`)."""
    out = []
    for turn in turns:
        content = turn.get("content")
        if isinstance(content, list) and any(isinstance(p.get("image"), ImageSource) for p in content):
            content = [_decoded(p["image"], allow_urls, fetch or fetch_url) if _is_source(p) else p for p in content]
            turn = {**turn, "content": content}
        out.append(turn)
    return out


def _is_source(part: dict) -> bool:
    return isinstance(part.get("image"), ImageSource)


def _decoded(source: ImageSource, allow_urls: bool, fetch: Callable[[str, str], bytes]) -> dict[str, Any]:
    name = f"'{source.where}'"
    try:
        if source.url[:5].lower() == "data:":
            decoded = decode_data_url(source.url, name)
        elif not allow_urls:
            raise bad_request(
                f"{name} is an http(s) URL, and this server fetches none: send the image inline as a data URL "
                "(data:image/png;base64,...), or start serve with --allow-image-urls",
                source.where,
                "image_url_not_allowed",
            )
        else:
            decoded = decode_bytes(fetch(source.url, source.where), name)
    except ImageError as exc:
        raise bad_request(str(exc), source.where, "invalid_image") from None
    source.read["digest"] = decoded.digest
    return image_part(decoded.image)


def fetch_url(url: str, where: str) -> bytes:
    """An image URL's bytes: at most MAX_BYTES, within FETCH_TIMEOUT_S, MAX_REDIRECTS redirects followed; a URL that
    cannot be fetched is an ImageError in one line."""
    from dflash_chat.runtime.endpoint import httpx_module

    httpx = httpx_module()
    name = f"'{where}'"
    timeout = httpx.Timeout(FETCH_TIMEOUT_S)
    try:
        with httpx.Client(timeout=timeout, follow_redirects=True, max_redirects=MAX_REDIRECTS) as client:
            with client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise ImageError(f"{name}: fetching {url} answered HTTP {response.status_code}: check the URL")
                data, deadline = bytearray(), time.monotonic() + FETCH_TIMEOUT_S
                for chunk in response.iter_bytes():
                    data += chunk
                    if time.monotonic() > deadline:  # a server sending a byte at a time meets no read timeout
                        raise httpx.ReadTimeout("too slow")
                    if len(data) > MAX_BYTES:
                        raise ImageError(f"{name}: {url} is larger than {MAX_BYTES // 2**20} MiB; send a smaller image")
                return bytes(data)
    except httpx.TimeoutException:
        raise ImageError(f"{name}: {url} did not arrive within {FETCH_TIMEOUT_S:g} s; send it inline") from None
    except httpx.HTTPError as exc:
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise ImageError(f"{name}: {url} cannot be fetched ({reason}); check the URL or send it inline") from None
