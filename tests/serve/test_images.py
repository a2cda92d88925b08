"""Images through serve, driven by the official `openai` and `anthropic` clients against the demo pair with its
(random) vision tower: an OpenAI `image_url` part, an Anthropic `image` block and a Responses `input_image` each
answered, their image tokens counted in `usage` and count_tokens, a next turn continuing the held image by its
content, http(s) URLs fetched only with --allow-image-urls, and bad images, a model without a tower, file ids and
images where none belong refused with a 400 in each dialect's shape."""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import threading
import time

import pytest

from dflash_chat.models.demo import demo_vision
from dflash_chat.runtime.endpoint import httpx_module

from .conftest import CONTEXT, serving

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
pytestmark = pytest.mark.skipif(demo_vision() is None, reason="the demo's vision tower is not in demo_data")

KEY = "sk-test-images"
MODEL = "dflash-chat-demo"
QUESTION = "What colour is the shape in the picture?"


def png(width: int = 300, height: int = 200, colour=(200, 30, 30)) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


@pytest.fixture(scope="module")
def vision_pair():
    from dflash_chat.engine.load import load_pair
    from dflash_chat.models.demo import demo_paths

    return load_pair(*demo_paths(), device="cpu", max_context=CONTEXT, vision=demo_vision())


@pytest.fixture(scope="module")
def image_tokens(vision_pair):
    """The prompt tokens the 300 x 200 test image takes (its placeholder run; the vision start and end are two more)."""
    from PIL import Image

    from dflash_chat.engine.images import prepare

    return prepare([Image.open(io.BytesIO(png()))], vision_pair.vision)[0].tokens


@pytest.fixture(scope="module")
def server(vision_pair):
    with serving(vision_pair, api_key=KEY) as running:
        running[0].name = MODEL
        yield running


@pytest.fixture(scope="module")
def openai_client(server):
    return openai.OpenAI(base_url=f"{server[1]}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def anthropic_client(server):
    return anthropic.Anthropic(base_url=server[1], api_key=KEY, max_retries=0, timeout=120)


def chat_parts(url: str, question: str = QUESTION) -> list[dict]:
    return [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}]


def ask_chat(client, content, **extra):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=8, temperature=0, **extra
    )


def post(server, path: str, body: dict):
    return httpx_module().post(f"{server[1]}{path}", headers={"Authorization": f"Bearer {KEY}"}, json=body, timeout=120)


def test_an_image_url_part_is_answered_and_its_tokens_are_in_usage(openai_client, image_tokens):
    shown = ask_chat(openai_client, chat_parts(data_url(png())))
    plain = ask_chat(openai_client, QUESTION)
    assert shown.choices[0].message.content and shown.choices[0].finish_reason in ("stop", "length")
    # the image's placeholder run and its vision start and end tokens, beside the same text
    assert shown.usage.prompt_tokens == plain.usage.prompt_tokens + image_tokens + 2
    assert image_tokens == (288 // 32) * (192 // 32)  # 300 x 200 resized to multiples of 32 within the budget


def test_a_streamed_answer_counts_the_image_too(openai_client, image_tokens):
    stream = ask_chat(openai_client, chat_parts(data_url(png())), stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    plain = ask_chat(openai_client, QUESTION)
    assert chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens + image_tokens + 2


def test_a_next_turn_continues_the_held_image_and_another_image_does_not(openai_client, image_tokens):
    red, blue = data_url(png(colour=(200, 30, 30))), data_url(png(colour=(30, 30, 200)))
    first = ask_chat(openai_client, chat_parts(red))
    answer = first.choices[0].message.content
    follow = [
        {"role": "user", "content": chat_parts(red)},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And its size?"},
    ]
    second = openai_client.chat.completions.create(model=MODEL, messages=follow, max_tokens=4, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens  # the image reused
    ask_chat(openai_client, "Something else entirely.")  # the engine now holds another chat
    other = openai_client.chat.completions.create(
        model=MODEL, messages=[{**follow[0], "content": chat_parts(blue)}, *follow[1:]], max_tokens=4, temperature=0
    )
    # the same text with another image shares nothing past the image's first token
    assert other.usage.prompt_tokens_details.cached_tokens < first.usage.prompt_tokens - image_tokens


def test_an_anthropic_image_block_is_answered_and_counted(anthropic_client, openai_client, image_tokens):
    block = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png()).decode()},
    }
    messages = [{"role": "user", "content": [block, {"type": "text", "text": QUESTION}]}]
    counted = anthropic_client.messages.count_tokens(model="claude-sonnet-4-5", messages=messages)
    message = anthropic_client.messages.create(
        model="claude-sonnet-4-5", max_tokens=8, messages=messages, extra_body={"temperature": 0}
    )
    assert message.content[0].type == "text" and message.content[0].text
    usage = message.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == counted.input_tokens
    plain = anthropic_client.messages.count_tokens(
        model="claude-sonnet-4-5", messages=[{"role": "user", "content": QUESTION}]
    )
    assert counted.input_tokens == plain.input_tokens + image_tokens + 2
    chat = ask_chat(openai_client, chat_parts(data_url(png())))
    assert counted.input_tokens == chat.usage.prompt_tokens  # the same conversation in both dialects


def test_an_image_in_a_tool_result_is_shown(anthropic_client):
    """Claude Code reads an image file with its Read tool: the tool_result holds the image block."""
    block = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png()).decode()},
    }
    call = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "shot.png"}}
    messages = [
        {"role": "user", "content": "Read shot.png"},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [block]}]},
    ]
    tool = {"name": "Read", "description": "Read a file", "input_schema": {"type": "object", "properties": {}}}
    with_image = anthropic_client.messages.count_tokens(model="claude-sonnet-4-5", messages=messages, tools=[tool])
    messages[2]["content"][0]["content"] = []
    without = anthropic_client.messages.count_tokens(model="claude-sonnet-4-5", messages=messages, tools=[tool])
    assert with_image.input_tokens > without.input_tokens + 2


def test_a_responses_input_image_is_answered_and_counted(openai_client, image_tokens):
    content = [{"type": "input_text", "text": QUESTION}, {"type": "input_image", "image_url": data_url(png())}]
    response = openai_client.responses.create(
        model=MODEL, input=[{"role": "user", "content": content}], max_output_tokens=8, temperature=0
    )
    follow = openai_client.responses.create(
        model=MODEL, previous_response_id=response.id, input="And its size?", max_output_tokens=4, temperature=0
    )
    assert response.output_text and response.status in ("completed", "incomplete")
    assert follow.usage.input_tokens_details.cached_tokens >= response.usage.input_tokens  # the kept image reused
    plain = openai_client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=8, temperature=0)
    assert response.usage.input_tokens == plain.usage.input_tokens + image_tokens + 2


def test_stored_responses_keep_their_images_within_a_byte_bound(server, monkeypatch):
    """previous_response_id through the server, its store bounded to two of these images: the newest responses
    still continue, the oldest was dropped whole and its id is a 400 that says to send the whole input."""
    from dflash_chat.serve.response_store import ResponseStore

    pictures = [png(64, 48, (40 * n, 200 - 40 * n, 90)) for n in range(4)]
    store = ResponseStore(max_image_bytes=2 * max(len(data_url(p)) for p in pictures) + 8)
    monkeypatch.setattr(server[0], "responses", store)

    def ask(picture: bytes, previous: str | None = None):
        content = [{"type": "input_text", "text": QUESTION}, {"type": "input_image", "image_url": data_url(picture)}]
        body = {"model": MODEL, "input": [{"role": "user", "content": content}], "max_output_tokens": 2}
        return post(server, "/v1/responses", {**body, **({"previous_response_id": previous} if previous else {})})

    ids = []
    for picture in pictures:
        reply = ask(picture)
        assert reply.status_code == 200, reply.text
        ids.append(reply.json()["id"])
        assert store.image_bytes <= store.max_image_bytes
    chained = ask(pictures[0], ids[-1])  # the newest continues with a picture it did not hold: that goes, not it
    assert chained.status_code == 200, chained.text
    dropped = ask(pictures[1], ids[0])
    message = dropped.json()["error"]["message"]
    assert dropped.status_code == 400 and "\n" not in message, dropped.text
    assert f"'previous_response_id' '{ids[0]}' is not a response this server keeps" in message
    assert message.endswith("send the whole conversation in 'input' instead.")
    assert store.recall(chained.json()["id"]) is not None and store.image_bytes <= store.max_image_bytes
    # held by the hash serve took as it decoded each image for the answer
    assert set(store._images) == {hashlib.sha256(p).hexdigest() for p in (pictures[3], pictures[0])}


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        if self.path not in ("/shot.png", "/slow.png"):
            self.send_error(404)
            return
        body = png()
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        step = 16 if self.path == "/slow.png" else len(body)
        try:
            for at in range(0, len(body), step):
                self.wfile.write(body[at : at + step])
                self.wfile.flush()
                if self.path == "/slow.png":  # a few bytes now and then: no read waits long, the whole download does
                    time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up on it

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image_site():
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{site.server_address[1]}"
    site.shutdown()


def test_image_urls_are_fetched_only_when_allowed(server, vision_pair, image_site, image_tokens):
    body = {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": chat_parts(f"{image_site}/shot.png")}],
    }
    refused = post(server, "/v1/chat/completions", body)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "image_url_not_allowed"
    assert "--allow-image-urls" in refused.json()["error"]["message"]
    block = {"type": "image", "source": {"type": "url", "url": f"{image_site}/shot.png"}}
    anthropic_body = {"max_tokens": 4, "messages": [{"role": "user", "content": [block]}]}
    error = post(server, "/v1/messages", anthropic_body).json()
    assert error["type"] == "error" and "--allow-image-urls" in error["error"]["message"]
    with serving(vision_pair, api_key=KEY, allow_image_urls=True) as allowing:
        fetched = post(allowing, "/v1/chat/completions", body)
        assert fetched.status_code == 200, fetched.text
        inline = post(
            allowing,
            "/v1/chat/completions",
            {**body, "messages": [{"role": "user", "content": chat_parts(data_url(png()))}]},
        )
        assert fetched.json()["usage"]["prompt_tokens"] == inline.json()["usage"]["prompt_tokens"]
        missing = {**body, "messages": [{"role": "user", "content": chat_parts(f"{image_site}/gone.png")}]}
        lost = post(allowing, "/v1/chat/completions", missing)
        assert lost.status_code == 400 and "answered HTTP 404" in lost.json()["error"]["message"]
        assert post(allowing, "/v1/messages", anthropic_body).status_code == 200


def _bomb() -> bytes:
    """A PNG whose few bytes claim 50000 x 50000 pixels."""
    from tests.runtime.test_image_decode import png as hand_written

    return hand_written(50_000, 50_000, 8, 0, b"\x00" * 64)


BAD_IMAGES = [
    (data_url(b"hello, this is text"), "is not an image"),
    (data_url(png()[:120]), "damaged or cut short"),
    (data_url(_bomb()), "too many pixels"),
    (data_url(b"<svg xmlns='http://www.w3.org/2000/svg'/>", "image/svg+xml"), "SVG"),
    ("data:image/png;base64,@@@notbase64@@@", "base64 is damaged"),
    ("ftp://example.com/shot.png", "not a data: or http(s) URL"),
]


@pytest.mark.parametrize("url, words", BAD_IMAGES)
def test_bad_images_are_400s_in_each_dialect(server, url, words):
    chat = post(
        server, "/v1/chat/completions", {"max_tokens": 4, "messages": [{"role": "user", "content": chat_parts(url)}]}
    )
    assert chat.status_code == 400 and words in chat.json()["error"]["message"], chat.text
    assert chat.json()["error"]["param"].startswith("messages[0].content[0].image_url")
    responses = post(
        server, "/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": url}]}]}
    )
    assert responses.status_code == 400 and words in responses.json()["error"]["message"], responses.text
    if url.startswith("data:") and ";base64," in url:
        mime, data = url[5:].split(";base64,")
        block = {"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}}
        messages = post(server, "/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": [block]}]})
        body = messages.json()
        assert messages.status_code == 400 and body["type"] == "error", messages.text
        assert body["error"]["type"] == "invalid_request_error" and words in body["error"]["message"]
    for response in (chat, responses):
        assert "Traceback" not in response.text and "\n" not in response.json()["error"]["message"]


def test_images_where_none_belong_are_400s(server):
    assistant = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": chat_parts(data_url(png()))}]
    refused = post(server, "/v1/chat/completions", {"max_tokens": 4, "messages": assistant})
    assert refused.status_code == 400 and "only user messages may hold images" in refused.json()["error"]["message"]
    filed = post(
        server,
        "/v1/responses",
        {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
    )
    assert filed.status_code == 400 and "keeps no files" in filed.json()["error"]["message"]
    block = {"type": "image", "source": {"type": "file", "file_id": "file_1"}}
    anthropic_filed = post(
        server, "/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": [block]}]}
    )
    assert anthropic_filed.status_code == 400 and "keeps no files" in anthropic_filed.json()["error"]["message"]
    pictured = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    system = post(
        server, "/v1/messages", {"max_tokens": 4, "system": [pictured], "messages": [{"role": "user", "content": "hi"}]}
    )
    assert system.status_code == 400 and "images go in user messages" in system.json()["error"]["message"]


def test_a_model_without_a_vision_tower_says_how_to_load_one(demo_pair):
    assert demo_pair.vision is None
    with serving(demo_pair, api_key=KEY) as running:
        body = {"max_tokens": 4, "messages": [{"role": "user", "content": chat_parts(data_url(png()))}]}
        chat = post(running, "/v1/chat/completions", body)
        assert chat.status_code == 400 and chat.json()["error"]["code"] == "images_not_supported"
        assert "loaded without a vision tower" in chat.json()["error"]["message"]
        assert "--mmproj FILE" in chat.json()["error"]["message"]
    with serving(demo_pair, api_key=KEY, settings={"vision": "off"}) as running:
        block = {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png()).decode()},
        }
        counted = post(running, "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": [block]}]})
        assert counted.status_code == 400 and "restart serve with --vision auto" in counted.json()["error"]["message"]


def test_the_flag_reaches_the_server(monkeypatch, tmp_path):
    """`serve --allow-image-urls` (and the body limit that inline images need) as the server gets them; nothing loads."""
    from dflash_chat import cli
    from dflash_chat.serve import MAX_BODY, server

    monkeypatch.setenv("DFLASH_CHAT_HOME", str(tmp_path))
    seen = []
    monkeypatch.setattr(server, "start_loading", lambda served, request, settings: None)
    monkeypatch.setattr(server, "serve_forever", lambda served, loader, host, port: seen.append(served) or 0)
    assert cli.main(["serve", "--demo", "--port", "0", "--allow-image-urls"]) == 0
    assert cli.main(["serve", "--demo", "--port", "0"]) == 0
    assert [s.allow_image_urls for s in seen] == [True, False]
    assert seen[1].max_body == MAX_BODY >= 32 * 2**20


def test_a_fetched_image_has_a_size_and_a_time_limit(image_site, monkeypatch):
    from dflash_chat.runtime.image_decode import ImageError
    from dflash_chat.serve import images

    assert images.fetch_url(f"{image_site}/shot.png", "x") == png()
    assert len(png()) > 16 * 20  # the slow one takes over a second
    monkeypatch.setattr(images, "FETCH_TIMEOUT_S", 0.3)
    with pytest.raises(ImageError, match=r"did not arrive within 0.3 s; send it inline"):
        images.fetch_url(f"{image_site}/slow.png", "x")
    monkeypatch.setattr(images, "MAX_BYTES", 256)
    with pytest.raises(ImageError, match="is larger than"):
        images.fetch_url(f"{image_site}/shot.png", "x")
