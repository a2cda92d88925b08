"""The store behind previous_response_id (serve/response_store.py): each image held once by its content (the hash serve
took when it decoded the image) however many responses hold it, its bytes bounded by dropping whole old responses,
the newest still continued as they were sent."""

from __future__ import annotations

import base64
import hashlib
import io

from dflash_chat.serve.images import ImageSource, shown
from dflash_chat.serve.response_store import ResponseStore


def png(seed: int, side: int = 64) -> bytes:
    """A PNG of noise (so it does not compress): about 3 x side² bytes, different for each seed."""
    import random

    from PIL import Image

    pixels = random.Random(seed).randbytes(side * side * 3)
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), pixels).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(data).decode()}"


def user(text: str, *urls: str) -> dict:
    parts = [
        {"type": "image", "image": ImageSource(url, f"input[0].content[{i}].image_url")} for i, url in enumerate(urls)
    ]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


def answer(text: str) -> dict:
    return {"role": "assistant", "content": text}


def answered(*turns: dict) -> list[dict]:
    """The turns as a request that was answered leaves them: serve decoded each image for the prompt."""
    shown(list(turns), allow_urls=False)
    return list(turns)


def test_an_image_is_held_once_by_content_and_comes_back_as_it_was_sent():
    store = ResponseStore()
    shot = png(1)
    url = data_url(shot)
    wrapped = "data:image/png;base64," + "\n".join(url[22:][i : i + 76] for i in range(0, len(url) - 22, 76))
    first = answered(user("what is it?", url), answer("a square"))
    store.remember("resp_1", first)
    chained = answered(*store.recall("resp_1"), user("and this one, the same?", wrapped), answer("yes"))
    store.remember("resp_2", chained)
    store.remember("resp_3", answered(user("again", url), answer("still")))  # another chat, the same picture
    assert store.image_bytes == len(url)  # three responses, four parts: one image held, as it was first sent
    assert store.recall("resp_1") == first
    back = store.recall("resp_2")
    assert [p["image"].url for t in back if isinstance(t["content"], list) for p in t["content"] if "image" in p] == [
        url,
        url,  # the line-wrapped base64 is the same bytes: it comes back as the first sending wrote it
    ]
    assert back[0]["content"][0]["image"].where == "input[0].content[0].image_url"
    assert list(store._images) == [hashlib.sha256(shot).hexdigest()]  # the content's hash names it


def test_many_responses_with_images_stay_under_the_byte_bound_and_the_newest_still_chain():
    pictures = [png(seed) for seed in range(40)]
    size = len(data_url(pictures[0]))
    store = ResponseStore(max_image_bytes=10 * size + size // 2)  # room for ten of them
    turns: list[dict] = []
    held = []
    for n, picture in enumerate(pictures):
        turns = answered(
            *(store.recall(f"resp_{n - 1}") or []), user(f"picture {n}?", data_url(picture)), answer(f"{n}")
        )
        store.remember(f"resp_{n}", turns)
        held.append(store.image_bytes)
        if n % 7 == 6:  # a new conversation now and then, each turn with a new picture
            store.remember(f"resp_{n}", answered(user(f"picture {n}?", data_url(picture)), answer(f"{n}")))
    assert max(held) <= store.max_image_bytes
    newest = store.recall("resp_39")
    assert newest is not None and newest[-1] == answer("39")
    assert store.recall("resp_0") is None and len(store) < 40  # dropped whole, the oldest first
    kept = [n for n in range(40) if store.recall(f"resp_{n}") is not None]
    assert kept == list(range(kept[0], 40))
    holders = {key for _, keys in store._responses.values() for key in keys}
    assert set(store._images) == holders  # no image is left that no response holds


def test_a_response_continued_is_kept_over_older_ones_and_one_over_the_bound_is_not_kept():
    pictures = [png(seed) for seed in range(4)]
    size = len(data_url(pictures[0]))
    store = ResponseStore(max_image_bytes=2 * size + size // 2, max_responses=3)
    store.remember("resp_a", [user("a", data_url(pictures[0])), answer("a")])
    store.remember("resp_b", [user("b", data_url(pictures[1])), answer("b")])
    assert store.recall("resp_a") is not None  # continued: now the most recent
    store.remember("resp_c", [user("c", data_url(pictures[2])), answer("c")])
    assert store.recall("resp_b") is None and store.recall("resp_a") is not None
    store.remember("resp_big", [user("all", *map(data_url, pictures[:3])), answer("three")])
    assert store.recall("resp_big") is None  # over the bound alone: not kept, and nothing dropped for it
    assert [r for r in ("resp_a", "resp_c") if store.recall(r)] == ["resp_a", "resp_c"]
    store.remember("resp_text", [user("no picture"), answer("ok")])  # text is not counted
    store.remember("resp_url", [user("by url", "https://example.com/shot.png"), answer("ok")])
    assert store.recall("resp_url")[0]["content"][0]["image"].url == "https://example.com/shot.png"
    for n in range(5):
        store.remember(f"resp_{n}", [user(str(n)), answer("ok")])
    assert len(store) == 3 and store.recall("resp_text") is None
