"""Downloads through the real huggingface_hub client against a local Hub (tests/hubserver.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import threading

import numpy as np
import pytest
from huggingface_hub import constants, hf_hub_download

from dflash_chat.models import hub
from dflash_chat.models.catalog import (
    SAFETENSORS_EXTRAS,
    SAFETENSORS_PATTERNS,
    TOKENIZER_EXTRAS,
    TOKENIZER_PATTERNS,
    Source,
)
from dflash_chat.models.sizes import size_text
from tests.hubserver import HubServer, Repo, isolate_hub

TARGET_REPO, DRAFTER_REPO, TOKENIZER_REPO = "tiny/Tiny-GGUF", "tiny/Tiny-DFlash", "tiny/Tiny"


def tiny_gguf(path, n: int, seed: int) -> bytes:
    """A real (tiny) GGUF file: one f32 tensor of n random values."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen35")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.random.default_rng(seed).standard_normal(n, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


@pytest.fixture
def repos(tmp_path_factory) -> dict[str, Repo]:
    work = tmp_path_factory.mktemp("repo-src")
    rng = np.random.default_rng(0)
    target = {
        "Tiny-Q8_0.gguf": tiny_gguf(work / "q8.gguf", 96_000, 1),
        "Tiny-Q4_K_M.gguf": tiny_gguf(work / "q4.gguf", 160_000, 2),
        "Tiny-UD-Q4_K_M.gguf": tiny_gguf(work / "ud.gguf", 1_000, 3),
        "mmproj-BF16.gguf": b"vision tower",
        "README.md": b"# Tiny\n",
    }
    drafter = {
        "config.json": b'{"architectures": ["DFlashDraftModel"], "block_size": 16}',
        "model.safetensors": rng.bytes(150_000),
    }
    tokenizer = {
        "tokenizer_config.json": b'{"model_max_length": 4096}',
        "tokenizer.json": b'{"version": "1.0"}',
        "chat_template.jinja": b"{% for m in messages %}{{ m.content }}{% endfor %}",
        "config.json": b'{"model_type": "qwen3_5"}',
        "model-00001-of-00002.safetensors": rng.bytes(10_000),
    }
    return {TARGET_REPO: Repo(target), DRAFTER_REPO: Repo(drafter), TOKENIZER_REPO: Repo(tokenizer)}


@pytest.fixture
def server(repos):
    with HubServer(repos) as running:
        yield running


@pytest.fixture(autouse=True)
def cache(monkeypatch, tmp_path):
    """A private HF cache (Xet off, online, no stored token) and fast retries."""
    monkeypatch.setattr(hub, "RETRY_WAIT", 0.01)
    return isolate_hub(monkeypatch, tmp_path)


def sources(quant: str = "Q4_K_M"):
    target = Source("gguf", quant, TARGET_REPO, patterns=(f"*{quant}*.gguf",))
    drafter = Source("safetensors", "BF16", DRAFTER_REPO, patterns=SAFETENSORS_PATTERNS, extras=SAFETENSORS_EXTRAS)
    tokenizer = Source("tokenizer", repo=TOKENIZER_REPO, patterns=TOKENIZER_PATTERNS, extras=TOKENIZER_EXTRAS)
    return target, drafter, tokenizer


def fetch_all(server, **kwargs):
    return hub.fetch(*sources(kwargs.pop("quant", "Q4_K_M")), endpoint=server.url, **kwargs)


def test_complete_download_lands_in_the_standard_cache(server, repos, cache):
    events: list[hub.Progress] = []
    files = fetch_all(server, progress=events.append)

    assert files.target.name == "Tiny-Q4_K_M.gguf"  # the plain quant, not UD- or mmproj
    assert files.target.read_bytes() == repos[TARGET_REPO].files["Tiny-Q4_K_M.gguf"]
    assert sorted(p.name for p in files.drafter.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in files.tokenizer.iterdir()) == [
        "chat_template.jinja",
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert files.target.is_relative_to(cache / "models--tiny--Tiny-GGUF" / "snapshots")
    import gguf

    assert gguf.GGUFReader(files.target).tensors[0].n_elements == 160_000

    # every file finished with a "done" report whose byte counts add up
    done = {e.file.filename: e for e in events if e.status == "done"}
    assert set(done) == {
        "Tiny-Q4_K_M.gguf",
        "config.json",
        "model.safetensors",
        "tokenizer_config.json",
        "tokenizer.json",
        "chat_template.jinja",
    }
    assert all(e.done == e.total == e.file.size for e in done.values())

    # other Hugging Face tools find the files offline, by name, in the same cache
    shared = hf_hub_download(TARGET_REPO, "Tiny-Q4_K_M.gguf", cache_dir=cache, local_files_only=True)
    assert shared == str(files.target)


def test_a_second_run_fetches_nothing(server, cache):
    first = fetch_all(server)
    before = len(server.requests)
    plan = hub.plan(*sources(), endpoint=server.url)
    assert all(f.cached for f in plan.files)
    again = hub.download(plan)
    assert again == first
    transfers = [r for r in server.requests[before:] if "/resolve/" in r.path or "/cdn/" in r.path]
    assert transfers == []


def test_progress_reports_bytes_speed_and_eta(server, monkeypatch):
    monkeypatch.setattr(hub, "PROGRESS_INTERVAL", 0.0)
    monkeypatch.setattr(hub, "CHUNK", 16 * 1024)
    server.delay = 0.002
    events: list[hub.Progress] = []
    fetch_all(server, progress=events.append)
    running = [e for e in events if e.status == "downloading" and e.file.filename == "Tiny-Q4_K_M.gguf"]
    assert len(running) >= 5
    assert [e.done for e in running] == sorted(e.done for e in running)
    mid = [e for e in running if e.done < e.total][-1]
    assert mid.speed > 0
    assert mid.eta == pytest.approx((mid.total - mid.done) / mid.speed)


def test_token_goes_to_the_hub_but_not_to_the_cdn(server, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    fetch_all(server)
    auth = {r.path.split("?")[0]: r.headers.get("authorization") for r in server.requests}
    assert auth[f"/api/models/{TARGET_REPO}/revision/main"] == "Bearer hf_test_token"
    resolve = [p for p in auth if "/resolve/" in p and p.endswith(".gguf")]
    cdn = [p for p in auth if p.startswith("/cdn/")]
    assert resolve and cdn
    assert all(auth[p] == "Bearer hf_test_token" for p in resolve)
    assert all(auth[p] is None for p in cdn)


def test_dropped_connection_resumes_with_a_range_request(server, repos):
    server.drop_after["Tiny-Q4_K_M.gguf"] = 200_000
    files = fetch_all(server)
    assert files.target.read_bytes() == repos[TARGET_REPO].files["Tiny-Q4_K_M.gguf"]
    ranges = [r.headers.get("range") for r in server.gets("/cdn/")]
    assert "bytes=200000-" in ranges  # continued from the byte where the connection broke


def test_cancel_leaves_a_partial_file_the_next_run_resumes(server, repos, cache, monkeypatch):
    monkeypatch.setattr(hub, "PROGRESS_INTERVAL", 0.0)
    server.delay = 0.005
    cancel = threading.Event()

    def stop_midway(event: hub.Progress) -> None:
        if event.file.filename == "Tiny-Q4_K_M.gguf" and event.done >= 192 * 1024:
            cancel.set()

    with pytest.raises(hub.DownloadCancelled):
        fetch_all(server, progress=stop_midway, cancel=cancel)
    partials = list(cache.glob("models--tiny--Tiny-GGUF/blobs/*.incomplete"))
    assert len(partials) == 1
    kept = partials[0].stat().st_size
    data = repos[TARGET_REPO].files["Tiny-Q4_K_M.gguf"]
    assert 192 * 1024 <= kept < len(data)
    assert partials[0].read_bytes() == data[:kept]
    assert not list(cache.glob("models--tiny--Tiny/blobs/*"))  # files after the cancel never start

    server.delay = 0.0
    events: list[hub.Progress] = []
    files = fetch_all(server, progress=events.append)
    assert files.target.read_bytes() == data
    sha = hashlib.sha256(data).hexdigest()
    assert server.gets(f"/cdn/{sha}")[-1].headers.get("range") == f"bytes={kept}-"
    assert any(e.status == "resuming" and e.done == kept for e in events)
    assert not list(cache.glob("**/*.incomplete"))


def test_a_server_that_ignores_ranges_still_gives_the_right_file(server, repos, cache):
    data = repos[TARGET_REPO].files["Tiny-Q4_K_M.gguf"]
    server.drop_after["Tiny-Q4_K_M.gguf"] = 300_000
    server.honour_ranges = False
    files = fetch_all(server)
    assert files.target.read_bytes() == data
    sha = hashlib.sha256(data).hexdigest()
    assert [r.headers.get("range") for r in server.gets(f"/cdn/{sha}")] == [None, "bytes=300000-"]


def test_a_busy_hub_is_retried_and_the_retries_are_bounded(server, repos):
    server.busy = 2
    files = fetch_all(server)
    assert files.target.read_bytes() == repos[TARGET_REPO].files["Tiny-Q4_K_M.gguf"]

    plan = hub.plan(*sources("Q8_0"), endpoint=server.url)
    server.busy = 1000
    before = len(server.requests)
    with pytest.raises(hub.HubError, match=r"keeps failing \(HTTP 503\); the partial file is kept"):
        hub.download(plan)
    assert len(server.requests) - before == hub.MAX_STALLED_ATTEMPTS


def test_a_file_gone_since_the_listing_is_one_clear_line(server, repos):
    plan = hub.plan(*sources(), endpoint=server.url)
    del repos[TARGET_REPO].files["Tiny-Q4_K_M.gguf"]
    with pytest.raises(hub.HubError) as err:
        hub.download(plan)
    assert str(err.value) == (
        "the Hub refused Tiny-Q4_K_M.gguf from tiny/Tiny-GGUF (HTTP 404); "
        "the repo changed since it was listed: run again"
    )


def test_not_enough_disk_stops_before_any_transfer(server):
    plan = hub.plan(*sources(), endpoint=server.url)
    with pytest.raises(hub.NotEnoughDiskError) as err:
        hub.download(plan, disk_free=lambda path: 50_000)
    message = str(err.value)
    assert "not enough disk space" in message and "HF_HUB_CACHE" in message
    assert f"needs {size_text(plan.missing_bytes())}, {size_text(50_000)} is free" in message
    assert not [r for r in server.requests if "/resolve/" in r.path or "/cdn/" in r.path]


def test_offline_with_everything_cached_makes_no_request(server, monkeypatch):
    online = fetch_all(server)
    seen = len(server.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = fetch_all(server)
    assert offline == online
    assert len(server.requests) == seen


def test_offline_names_exactly_what_is_missing(server, monkeypatch):
    target, drafter, tokenizer = sources()
    hub.fetch(Source("gguf", "Q8_0", TARGET_REPO, patterns=("*Q8_0*.gguf",)), None, tokenizer, endpoint=server.url)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hub.OfflineError) as err:
        hub.plan(target, drafter, tokenizer, endpoint=server.url)
    message = str(err.value)
    assert message.startswith("offline (HF_HUB_OFFLINE is set), and the cache (")
    lacks = message.split(" lacks: ")[1].split(". ")[0]
    assert lacks == "tiny/Tiny-GGUF *Q4_K_M*.gguf (Q4_K_M); tiny/Tiny-DFlash config.json *.safetensors (BF16)"


def test_offline_with_an_empty_cache_lists_every_part(server, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # as if HF_HUB_OFFLINE=1 at import
    with pytest.raises(hub.OfflineError) as err:
        fetch_all(server)
    lacks = str(err.value).split(" lacks: ")[1].split(". ")[0]
    assert lacks.split("; ") == [
        "tiny/Tiny-GGUF *Q4_K_M*.gguf (Q4_K_M)",
        "tiny/Tiny-DFlash config.json *.safetensors (BF16)",
        "tiny/Tiny tokenizer_config.json",
    ]
    assert server.requests == []


def test_unreachable_hub_falls_back_to_the_cache(server):
    online = fetch_all(server)
    gone = "http://127.0.0.1:9"  # discard port: connection refused
    assert hub.fetch(*sources(), endpoint=gone) == online
    with pytest.raises(hub.OfflineError) as err:
        hub.plan(*sources("Q8_0"), endpoint=gone)
    assert f"cannot reach {gone}" in str(err.value)
    assert "tiny/Tiny-GGUF *Q8_0*.gguf (Q8_0)" in str(err.value)


def test_missing_quant_names_the_repo_and_its_quants(server):
    with pytest.raises(hub.MissingFilesError) as err:
        hub.plan(*sources("Q6_K"), endpoint=server.url)
    assert str(err.value) == (
        "tiny/Tiny-GGUF has no Q6_K GGUF (no file matches '*Q6_K*.gguf'); "
        "it has: Q4_K_M, Q8_0, UD-Q4_K_M. Pick one of those with --quant/--drafter-quant"
    )


def test_unknown_repo_is_one_clear_line(server):
    target = Source("gguf", "Q4_K_M", "tiny/Nope-GGUF", patterns=("*Q4_K_M*.gguf",))
    with pytest.raises(hub.HubError, match=r"^tiny/Nope-GGUF was not found on the Hub; .*HF_TOKEN"):
        hub.plan(target, None, sources()[2], endpoint=server.url)


def test_a_corrupt_transfer_is_refused_and_removed(server, cache):
    plan = hub.plan(*sources(), endpoint=server.url)
    target = plan.parts[0]
    wrong = dataclasses.replace(target.files[0], sha256=hashlib.sha256(b"other").hexdigest())
    bad = dataclasses.replace(plan, parts=(dataclasses.replace(target, files=(wrong,)),))
    with pytest.raises(hub.HubError, match="failed verification"):
        hub.download(bad)
    assert not list(cache.glob("**/*.incomplete"))
    assert not (cache / "models--tiny--Tiny-GGUF" / "blobs" / wrong.sha256).exists()


def test_split_gguf_fetches_every_part():
    files = {
        "Q8_0/Big-Q8_0-00001-of-00002.gguf": b"a" * 70_000,
        "Q8_0/Big-Q8_0-00002-of-00002.gguf": b"b" * 30_000,
        "Big-Q4_K_M.gguf": b"c" * 1000,
        "tokenizer_config.json": b"{}",
    }
    with HubServer({"big/Big-GGUF": Repo(files)}) as running:
        target = Source("gguf", "Q8_0", "big/Big-GGUF", patterns=("*Q8_0*.gguf",))
        tokenizer = Source("tokenizer", repo="big/Big-GGUF", patterns=TOKENIZER_PATTERNS)
        plan = hub.plan(target, None, tokenizer, endpoint=running.url)
        assert [f.filename for f in plan.parts[0].files] == [
            "Q8_0/Big-Q8_0-00001-of-00002.gguf",
            "Q8_0/Big-Q8_0-00002-of-00002.gguf",
        ]
        got = hub.download(plan)
    assert got.target.name == "Big-Q8_0-00001-of-00002.gguf"
    assert (got.target.parent / "Big-Q8_0-00002-of-00002.gguf").read_bytes() == b"b" * 30_000
    assert got.drafter is None and (got.tokenizer / "tokenizer_config.json").read_bytes() == b"{}"


def test_cached_parts_reads_the_cache_without_network(server, cache):
    target, drafter, tokenizer = sources()
    assert hub.cached_parts(target, cache) is None
    files = fetch_all(server)
    assert hub.cached_parts(target, cache) == (files.target,)
    assert hub.cached_parts(sources("Q8_0")[0], cache) is None


# --- gated repos (the z-lab Qwen3.6 drafters) -------------------------------------------------------


@pytest.fixture
def gated(repos):
    """The drafter repo gated as the z-lab Qwen3.6 ones are; the token "granted" has accepted its terms."""
    repos[DRAFTER_REPO].gated = "manual"
    repos[DRAFTER_REPO].granted = {"granted"}
    with HubServer(repos, tokens={"granted": "ada", "refused": "bob"}) as running:
        yield running


def test_a_gated_repo_without_a_token_stops_before_any_transfer_with_the_steps(gated):
    plan = hub.plan(*sources(), endpoint=gated.url)
    assert plan.gated_repos == (DRAFTER_REPO,)
    with pytest.raises(hub.GatedRepoAccessError) as err:
        hub.download(plan)
    message = str(err.value)
    assert message == (
        f"{DRAFTER_REPO} is gated: accept its terms on {gated.url}/{DRAFTER_REPO} (logged in to Hugging Face), "
        "then give dflash-chat a token: run `hf auth login` or set HF_TOKEN (a read token from "
        "https://huggingface.co/settings/tokens), and start again"
    )
    assert not err.value.token_present
    assert not gated.gets("/resolve/") and not gated.gets("/cdn/")  # not even the open target


def test_a_token_without_access_is_told_to_accept_the_terms(gated, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "refused")
    with pytest.raises(hub.GatedRepoAccessError) as err:
        hub.download(hub.plan(*sources(), endpoint=gated.url))
    assert err.value.token_present
    assert str(err.value).startswith(
        f"{DRAFTER_REPO} is gated and the token in HF_TOKEN has no access to it yet: "
        f"accept its terms on {gated.url}/{DRAFTER_REPO} with the same account"
    )
    checks = gated.gets("/auth-check")
    assert checks and checks[-1].headers["authorization"] == "Bearer refused"  # asked the Hub, as 403 answers


def test_a_token_with_access_downloads(gated, monkeypatch, repos):
    monkeypatch.setenv("HF_TOKEN", "granted")
    files = hub.fetch(*sources(), endpoint=gated.url)
    assert (files.drafter / "model.safetensors").read_bytes() == repos[DRAFTER_REPO].files["model.safetensors"]


def test_a_gated_file_refused_mid_download_is_the_same_one_line(gated, monkeypatch):
    """If access goes away between the check and the transfer, the Hub's 401 says the same thing."""
    plan = hub.plan(*sources(), endpoint=gated.url)
    monkeypatch.setattr(hub, "check_access", lambda plan: None)
    with pytest.raises(hub.GatedRepoAccessError, match=f"^{DRAFTER_REPO} is gated: accept its terms"):
        hub.download(plan)


def test_cached_gated_files_need_no_token(gated, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "granted")
    hub.fetch(*sources(), endpoint=gated.url)
    monkeypatch.delenv("HF_TOKEN")
    plan = hub.plan(*sources(), endpoint=gated.url)
    assert plan.gated_repos == ()
    hub.download(plan)


def test_save_token_stores_it_as_hf_auth_login_does(gated, monkeypatch, cache):
    from huggingface_hub import constants, get_token

    from tests.hubserver import point_login_at

    point_login_at(monkeypatch, gated)
    with pytest.raises(hub.HubError, match=r"the Hub did not accept that token \(HTTP 401\)"):
        hub.save_token("typo")
    assert get_token() is None
    hub.save_token("  granted\n")
    assert get_token() == "granted"
    assert open(constants.HF_TOKEN_PATH).read() == "granted"  # where `hf auth login` keeps it
    assert "granted" in open(constants.HF_STORED_TOKENS_PATH).read()
    plan = hub.plan(*sources(), endpoint=gated.url)
    hub.download(plan)  # the stored token now opens the gated repo


# --- the vision tower's mmproj GGUF, fetched beside the target ------------------------------------------


def mmproj_source(pattern: str = "*mmproj*F16*.gguf") -> Source:
    return Source("mmproj", "", TARGET_REPO, patterns=(pattern,))


@pytest.fixture
def towers(repos):
    """The target repo with its towers in three types (as unsloth ships them), each large enough to be cut."""
    rng = np.random.default_rng(5)
    for name, size in (("mmproj-F16.gguf", 300_000), ("mmproj-BF16.gguf", 300_001), ("mmproj-F32.gguf", 600_000)):
        repos[TARGET_REPO].files[name] = rng.bytes(size)
    with HubServer(repos) as running:
        yield running


def test_the_mmproj_is_fetched_with_the_model_with_progress(towers, repos, cache):
    events: list[hub.Progress] = []
    files = fetch_all(towers, progress=events.append, mmproj=mmproj_source())
    assert files.target.name == "Tiny-Q4_K_M.gguf"  # the target never takes the tower's file
    assert files.mmproj is not None and files.mmproj.name == "mmproj-F16.gguf"  # not BF16 (a longer name)
    assert files.mmproj.read_bytes() == repos[TARGET_REPO].files["mmproj-F16.gguf"]
    assert files.mmproj.parent == files.target.parent  # the same snapshot of the target's repo
    done = [e for e in events if e.status == "done" and e.file.filename == "mmproj-F16.gguf"]
    assert len(done) == 1 and done[0].file.role == "mmproj" and done[0].done == 300_000
    assert fetch_all(towers).mmproj is None  # no tower asked for: none fetched
    assert hub.cached_parts(mmproj_source(), cache) == (files.mmproj,)
    assert hub.cached_parts(mmproj_source("*mmproj*F32*.gguf"), cache) is None


def test_a_dropped_mmproj_download_resumes_with_a_range_request(towers, repos):
    towers.drop_after["mmproj-F16.gguf"] = 120_000
    files = fetch_all(towers, mmproj=mmproj_source())
    assert files.mmproj.read_bytes() == repos[TARGET_REPO].files["mmproj-F16.gguf"]
    sha = hashlib.sha256(repos[TARGET_REPO].files["mmproj-F16.gguf"]).hexdigest()
    assert [r.headers.get("range") for r in towers.gets(f"/cdn/{sha}")][-1] == "bytes=120000-"


def test_a_repo_without_the_tower_says_which_it_has(server):
    # '*F16*' takes a BF16 tower where there is no F16 one
    assert hub.plan(*sources(), endpoint=server.url, mmproj=mmproj_source()).parts[-1].files[0].filename == (
        "mmproj-BF16.gguf"
    )
    with pytest.raises(hub.MissingFilesError) as exc:
        hub.plan(*sources(), endpoint=server.url, mmproj=mmproj_source("*mmproj*F32*.gguf"))
    assert str(exc.value) == (
        f"{TARGET_REPO} has no vision tower file matching '*mmproj*F32*.gguf' (it has: mmproj-BF16.gguf); set "
        "`vision = off` to run without images, or fix `target.mmproj` in the catalog or config"
    )


def test_offline_the_cached_tower_is_found_and_a_missing_one_named(towers, monkeypatch):
    fetch_all(towers, mmproj=mmproj_source())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = len(towers.requests)
    files = hub.fetch(*sources(), endpoint=towers.url, mmproj=mmproj_source())
    assert files.mmproj is not None and files.mmproj.name == "mmproj-F16.gguf"
    assert len(towers.requests) == before
    with pytest.raises(hub.OfflineError, match=r"lacks: tiny/Tiny-GGUF \*mmproj\*F32\*\.gguf"):
        hub.plan(*sources(), endpoint=towers.url, mmproj=mmproj_source("*mmproj*F32*.gguf"))


def test_a_safetensors_target_brings_its_tower_and_its_preprocessing(repos):
    """A Hugging Face checkpoint holds `model.visual.*` in its own shards: every shard comes, and the
    preprocessor_config.json that sets the tower's pixel budget, mean and std."""
    rng = np.random.default_rng(9)
    repos["Qwen/Tiny-VL"] = Repo(
        {
            "config.json": b'{"vision_config": {"depth": 1}}',
            "model.safetensors.index.json": b"{}",
            "model-00001-of-00002.safetensors": rng.bytes(20_000),
            "model-00002-of-00002.safetensors": rng.bytes(20_000),
            "preprocessor_config.json": b'{"size": {"shortest_edge": 65536, "longest_edge": 16777216}}',
            "README.md": b"# Tiny VL\n",
        }
    )
    target = Source("safetensors", "BF16", "Qwen/Tiny-VL", patterns=SAFETENSORS_PATTERNS, extras=SAFETENSORS_EXTRAS)
    with HubServer(repos) as running:
        files = hub.fetch(target, None, sources()[2], endpoint=running.url)
    assert sorted(p.name for p in files.target.iterdir()) == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "preprocessor_config.json",
    ]
