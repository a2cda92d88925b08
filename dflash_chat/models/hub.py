"""Downloads and the cache: model files from the Hugging Face Hub into its standard cache.
One file past 500 lines: planning, sizing, resuming and verifying a download are steps of one path.

Files live where every Hugging Face tool looks for them (HF_HUB_CACHE, by default
~/.cache/huggingface/hub), so a model fetched here is shared with transformers,
llama.cpp's `-hf` and the `hf` CLI. huggingface_hub does the talking: the repo
listing (`HfApi.model_info`), URLs, auth headers (HF_TOKEN or a stored login),
the offline switch (HF_HUB_OFFLINE), the HTTP session and the cache layout.

Gated repos (the z-lab Qwen3.6 drafters): their listing is public but their files need a token
whose account accepted the repo's terms. `plan` notes which parts are gated, and `download` checks
access before it fetches anything, raising `GatedRepoAccessError` with the exact steps; the app
then offers a token field, which `save_token` stores the way `hf auth login` does.

One thing it no longer does is keep a partial file when a download stops, so the
transfer itself is done here, into `blobs/<etag>.incomplete` of the repo's cache
folder (the name older huggingface_hub versions resumed from). A stop, a dropped
connection or a cancel leaves that file; the next run continues it with an HTTP
Range request. A finished file is checked against the listing's size and hash
(sha256 for LFS files, the git blob id for small ones), moved to `blobs/`, and
linked into `snapshots/<commit>/` by huggingface_hub itself.

Typical use:

    plan = hub.plan(choice.target, choice.drafter, choice.pair.tokenizer)
    files = hub.download(plan, progress=callback, cancel=event)
    files.target, files.drafter, files.tokenizer   # local paths

Every function here is one step of that one path: they share the plan's file list and huggingface_hub's cache
layout.

The vision tower's mmproj GGUF (`mmproj=`, the picker's `choice.vision.source` when it loads the tower) is one
more part, fetched the same way beside the target.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from huggingface_hub import HfApi, constants, get_token, hf_hub_download, hf_hub_url, login
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from dflash_chat.errors import UserError
from dflash_chat.models.catalog import Source, matches, quant_of, split_group
from dflash_chat.models.sizes import size_text

try:  # huggingface_hub >= 2.4 talks through httpx2, earlier 1.x through httpx
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx  # type: ignore[no-redef]  # the same API under its older name

CHUNK = 1 << 20
MAX_STALLED_ATTEMPTS = 5  # connection attempts in a row that bring no new byte
RETRY_WAIT = 1.0  # seconds, doubled per stalled attempt
DISK_MARGIN = 256 << 20
PROGRESS_INTERVAL = 0.1  # seconds between progress reports for one file
SPEED_WINDOW = 5.0  # seconds of samples the speed is averaged over


class HubError(UserError):
    """A download or lookup failed in a way the user can act on; the message says how."""


class MissingFilesError(HubError):
    """A repo has no file for what was asked (a quant it does not publish, say)."""


class OfflineError(HubError):
    """Offline (or the Hub unreachable) and the cache lacks files; the message lists them."""


class NotEnoughDiskError(HubError):
    pass


class GatedRepoAccessError(HubError):
    """A gated repo's files are needed and this machine's token (if any) may not read them."""

    def __init__(self, repo: str, token_present: bool, endpoint: str = constants.ENDPOINT) -> None:
        self.repo = repo
        self.token_present = token_present
        self.page = f"{endpoint.rstrip('/')}/{repo}"
        super().__init__(gated_message(repo, self.page, token_present))


def gated_message(repo: str, page: str, token_present: bool) -> str:
    """One line: what to do to read a gated repo."""
    if not token_present:
        return (
            f"{repo} is gated: accept its terms on {page} (logged in to Hugging Face), then give "
            "dflash-chat a token: run `hf auth login` or set HF_TOKEN (a read token from "
            "https://huggingface.co/settings/tokens), and start again"
        )
    via = "the token in HF_TOKEN" if os.environ.get("HF_TOKEN") else "your Hugging Face token"
    return (
        f"{repo} is gated and {via} has no access to it yet: accept its terms on {page} with the "
        "same account (some repos approve by hand: wait for the e-mail), then start again"
    )


class DownloadCancelled(HubError):
    def __init__(self) -> None:
        super().__init__("download cancelled; the partial files are kept and the next run resumes them")


@dataclass(frozen=True)
class RemoteFile:
    role: str  # "target", "drafter", "tokenizer" or "mmproj"
    repo: str
    filename: str
    commit: str
    size: int
    sha256: str | None = None  # LFS files
    blob_id: str | None = None  # git blob id (small files; the Hub's ETag for them)
    cached: bool = False

    @property
    def etag(self) -> str:
        return self.sha256 or self.blob_id or ""

    @property
    def key(self) -> str:
        return f"{self.repo}/{self.filename}"


@dataclass(frozen=True)
class Part:
    """One part of a model (target, drafter, tokenizer or the vision tower's mmproj) resolved to files."""

    role: str
    source: Source
    files: tuple[RemoteFile, ...] = ()
    path: Path | None = None  # a local file the user gave: nothing to fetch
    gated: bool = False  # the repo needs a token with access to its files

    @property
    def repo(self) -> str | None:
        return self.source.repo


@dataclass(frozen=True)
class Plan:
    parts: tuple[Part, ...]
    cache_dir: Path
    endpoint: str = constants.ENDPOINT
    token: str | bool | None = None

    @property
    def files(self) -> tuple[RemoteFile, ...]:
        return tuple(f for part in self.parts for f in part.files)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def to_fetch(self) -> tuple[RemoteFile, ...]:
        return tuple(f for f in self.files if not f.cached)

    @property
    def gated_repos(self) -> tuple[str, ...]:
        """Gated repos the plan still has files to fetch from."""
        return tuple(
            dict.fromkeys(p.source.hub_repo for p in self.parts if p.gated and any(not f.cached for f in p.files))
        )

    def missing_bytes(self) -> int:
        """Bytes still to fetch, counting what partial files already hold."""
        return sum(max(0, f.size - _partial_size(self.cache_dir, f)) for f in self.to_fetch)


@dataclass(frozen=True)
class ModelFiles:
    target: Path  # the GGUF (first part of a split one)
    drafter: Path | None  # a GGUF, or a folder with config.json + safetensors
    tokenizer: Path  # a folder with the tokenizer and chat template files
    mmproj: Path | None = None  # the vision tower's GGUF, when the plan has one


@dataclass(frozen=True)
class Progress:
    file: RemoteFile
    done: int
    total: int
    speed: float = 0.0  # bytes per second over the last few seconds
    eta: float | None = None  # seconds
    status: str = "downloading"  # "cached", "resuming", "downloading", "verifying", "done"


ProgressCallback = Callable[[Progress], None]


def default_cache_dir() -> Path:
    """HF_HUB_CACHE, else HF_HOME/hub, else huggingface_hub's default (read now, not at import)."""
    if value := os.environ.get("HF_HUB_CACHE"):
        return Path(value).expanduser()
    if value := os.environ.get("HF_HOME"):
        return Path(value).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


def default_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def is_offline() -> bool:
    """HF_HUB_OFFLINE, as huggingface_hub read it at import or as the environment says now."""
    value = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return constants.is_offline_mode() or value in constants.ENV_VARS_TRUE_VALUES


# --- planning ---------------------------------------------------------------------------------------


def plan(
    target: Source,
    drafter: Source | None,
    tokenizer: Source,
    *,
    cache_dir: str | Path | None = None,
    endpoint: str | None = None,
    token: str | bool | None = None,
    mmproj: Source | None = None,
) -> Plan:
    """Resolve each source to concrete files from the repo listing (or the cache, offline); `mmproj`: the vision
    tower's GGUF, fetched beside the others.

    Raises MissingFilesError when a repo lacks what a pattern asks for (naming the quants the
    repo has), and OfflineError, listing every missing piece, when offline with an incomplete cache.
    """
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    endpoint = endpoint or default_endpoint()
    listings = _Listings(cache, endpoint, token)
    parts, missing = [], []
    for role, source in (("target", target), ("drafter", drafter), ("tokenizer", tokenizer), ("mmproj", mmproj)):
        if source is None:
            continue
        if source.path is not None:
            if not source.path.exists():
                raise HubError(f"{role} {source.path} does not exist; check the path in your config or flags")
            parts.append(Part(role, source, path=source.path))
            continue
        listing = listings.get(source.hub_repo, source.revision)
        try:
            files = _select(role, source, listing)
        except MissingFilesError:
            if not listing.from_cache:
                raise
            missing.append(_missing_line(source))
            continue
        parts.append(Part(role, source, files, gated=listing.gated))
    if missing:
        raise OfflineError(
            f"{listings.offline_reason}, and the cache ({cache}) lacks: {'; '.join(missing)}. "
            + (
                "Unset HF_HUB_OFFLINE, or run `dflash-chat pull` once with a network."
                if is_offline()
                else "Check your connection (or HF_ENDPOINT) and try again."
            )
        )
    return Plan(tuple(parts), cache, endpoint, token)


@dataclass
class _Listing:
    repo: str
    revision: str
    commit: str
    entries: dict[str, tuple[int, str | None, str | None]]  # filename -> (size, sha256, blob_id)
    cached: set[str] = field(default_factory=set)  # complete in the cache at this commit
    from_cache: bool = False
    gated: bool = False


class _Listings:
    """Repo listings, fetched once per repo; offline or unreachable, read from the cache."""

    def __init__(self, cache: Path, endpoint: str, token):
        self.cache, self.endpoint, self.token = cache, endpoint, token
        self.offline_reason = "offline (HF_HUB_OFFLINE is set)" if is_offline() else ""
        self._seen: dict[tuple[str, str], _Listing] = {}

    def get(self, repo: str, revision: str) -> _Listing:
        key = (repo, revision)
        if key not in self._seen:
            self._seen[key] = self._fetch(repo, revision)
        return self._seen[key]

    def _fetch(self, repo: str, revision: str) -> _Listing:
        if not self.offline_reason:
            try:
                return self._remote(repo, revision)
            except (httpx.TransportError, OfflineModeIsEnabled) as exc:
                self.offline_reason = f"cannot reach {self.endpoint} ({type(exc).__name__})"
            except HFValidationError:
                raise HubError(
                    f"{repo!r} is not a Hub repo name (owner/name); fix it in the catalog or config"
                ) from None
            except HfHubHTTPError as exc:
                if isinstance(exc, (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError)):
                    raise _repo_error(exc, repo, revision, self.endpoint) from None
                status = exc.response.status_code if exc.response is not None else "?"
                self.offline_reason = f"the Hub answered HTTP {status} for {repo}"
        return _cached_listing(self.cache, repo, revision)

    def _remote(self, repo: str, revision: str) -> _Listing:
        info = HfApi(endpoint=self.endpoint, token=self.token).model_info(repo, revision=revision, files_metadata=True)
        entries = {}
        for sibling in info.siblings or []:
            sha256 = sibling.lfs.sha256 if sibling.lfs else None
            entries[sibling.rfilename] = (sibling.size or 0, sha256, sibling.blob_id)
        listing = _Listing(repo, revision, info.sha or revision, entries, gated=bool(info.gated))
        snapshot = _storage(self.cache, repo) / "snapshots" / listing.commit
        for name, (size, sha256, blob_id) in entries.items():
            if _complete(snapshot / name, size) or _complete(_blob(self.cache, repo, sha256 or blob_id), size):
                listing.cached.add(name)
        return listing


def _repo_error(exc: HfHubHTTPError, repo: str, revision: str, endpoint: str) -> HubError:
    if isinstance(exc, GatedRepoError):
        return GatedRepoAccessError(repo, get_token() is not None, endpoint)
    if isinstance(exc, RevisionNotFoundError):
        return HubError(f"{repo} has no revision {revision!r}; fix the revision in the catalog or config")
    return HubError(f"{repo} was not found on the Hub; check the name, or set HF_TOKEN if it is private")


def _cached_listing(cache: Path, repo: str, revision: str) -> _Listing:
    """What the cache holds for repo@revision: the snapshot that refs/<revision> points at."""
    storage = _storage(cache, repo)
    commit = revision
    ref = storage / "refs" / revision
    if ref.is_file():
        commit = ref.read_text().strip()
    snapshot = storage / "snapshots" / commit
    entries: dict[str, tuple[int, str | None, str | None]] = {}
    if snapshot.is_dir():
        for path in sorted(snapshot.rglob("*")):
            if path.is_file():
                entries[path.relative_to(snapshot).as_posix()] = (path.stat().st_size, None, None)
    return _Listing(repo, revision, commit, entries, cached=set(entries), from_cache=True)


def _select(role: str, source: Source, listing: _Listing) -> tuple[RemoteFile, ...]:
    if source.kind == "gguf":
        names = _select_gguf(source, listing)
    elif source.kind == "mmproj":
        names = _select_mmproj(source, listing)
    else:
        names = _select_all(source, listing)
    return tuple(
        RemoteFile(
            role,
            listing.repo,
            name,
            listing.commit,
            listing.entries[name][0],
            sha256=listing.entries[name][1],
            blob_id=listing.entries[name][2],
            cached=name in listing.cached,
        )
        for name in names
    )


def _select_gguf(source: Source, listing: _Listing) -> list[str]:
    """The one GGUF (or the parts of one split GGUF) a quant pattern names.

    'Q4_K_M' can match 'X-Q4_K_M.gguf' and 'X-UD-Q4_K_M.gguf': the shortest name wins,
    the plain quant. mmproj files (vision towers) never count.
    """
    pattern = source.patterns[0]
    found = [n for n in listing.entries if matches(n, pattern) and "mmproj" not in n.lower()]
    if not found:
        raise MissingFilesError(_missing_quant(source, listing))
    groups: dict[str, list[str]] = {}
    for name in found:
        groups.setdefault(split_group(name), []).append(name)
    best = min(groups, key=lambda g: (len(g), g))
    return sorted(groups[best])


def _select_mmproj(source: Source, listing: _Listing) -> list[str]:
    """The one mmproj GGUF a pattern names; of several ('mmproj-F16.gguf', 'mmproj-BF16.gguf' for '*F16*'), the
    shortest name: the plain type."""
    pattern = source.patterns[0]
    found = [n for n in listing.entries if matches(n, pattern) and "mmproj" in n.lower()]
    if not found:
        towers = sorted(n for n in listing.entries if "mmproj" in n.lower() and n.lower().endswith(".gguf"))
        have = ", ".join(towers) if towers else "no mmproj file"
        raise MissingFilesError(
            f"{listing.repo} has no vision tower file matching {pattern!r} (it has: {have}); set `vision = off` to "
            "run without images, or fix `target.mmproj` in the catalog or config"
        )
    return [min(found, key=lambda n: (len(n), n))]


def _select_all(source: Source, listing: _Listing) -> list[str]:
    names: list[str] = []
    for pattern in source.patterns:
        found = sorted(n for n in listing.entries if matches(n, pattern))
        if not found:
            raise MissingFilesError(f"{listing.repo} has no file matching {pattern!r}")
        names += [n for n in found if n not in names]
    for pattern in source.extras:
        names += sorted(n for n in listing.entries if matches(n, pattern) and n not in names)
    return names


def _missing_quant(source: Source, listing: _Listing) -> str:
    quants = sorted({q for n in listing.entries if "mmproj" not in n.lower() if (q := quant_of(n))})
    have = ", ".join(quants) if quants else "no GGUF files"
    return (
        f"{listing.repo} has no {source.quant or 'file'} GGUF (no file matches {source.patterns[0]!r}); "
        f"it has: {have}. Pick one of those with --quant/--drafter-quant"
    )


def _missing_line(source: Source) -> str:
    return source.describe() + (f" ({source.quant})" if source.quant else "")


def cached_parts(source: Source, cache_dir: str | Path | None = None) -> tuple[Path, ...] | None:
    """The cached files of a source (no network), or None when anything is missing."""
    if source.path is not None:
        return (source.path,) if source.path.exists() else None
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    listing = _cached_listing(cache, source.hub_repo, source.revision)
    try:
        files = _select("", source, listing)
    except MissingFilesError:
        return None
    snapshot = _storage(cache, source.hub_repo) / "snapshots" / listing.commit
    return tuple(snapshot / f.filename for f in files)


# --- downloading ------------------------------------------------------------------------------------


def download(
    plan: Plan,
    *,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    disk_free: Callable[[Path], int] | None = None,
) -> ModelFiles:
    """Fetch every file the plan lacks, resuming partial files; return the local paths.

    Checks free disk first (NotEnoughDiskError), stops between chunks when `cancel` is set
    (DownloadCancelled, partial files kept), and verifies each file's size and hash.
    """
    report = progress or (lambda _p: None)
    cancel = cancel or threading.Event()
    check_access(plan)
    _check_disk(plan, disk_free or _free_bytes)
    for part in plan.parts:
        for file in part.files:
            if file.cached:
                _link(plan, file)
                report(Progress(file, file.size, file.size, status="cached"))
            else:
                _fetch(plan, file, report, cancel)
        _write_ref(plan, part)
    return _model_files(plan)


def fetch(
    target: Source,
    drafter: Source | None,
    tokenizer: Source,
    *,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    **where,
) -> ModelFiles:
    """plan() then download(): the local paths of a model, fetching what is missing."""
    return download(plan(target, drafter, tokenizer, **where), progress=progress, cancel=cancel)


def check_access(plan: Plan) -> None:
    """GatedRepoAccessError for the first gated repo the plan needs files from that the token cannot read."""
    for repo in plan.gated_repos:
        token = plan.token if isinstance(plan.token, str) else get_token()
        if not token:
            raise GatedRepoAccessError(repo, False, plan.endpoint)
        try:
            HfApi(endpoint=plan.endpoint, token=token).auth_check(repo)
        except GatedRepoError:
            raise GatedRepoAccessError(repo, True, plan.endpoint) from None
        except (HfHubHTTPError, httpx.TransportError) as exc:
            raise HubError(
                f"could not check access to {repo} ({type(exc).__name__}); check your connection and try again"
            ) from None


def save_token(token: str) -> None:
    """Check a Hugging Face token with the Hub and store it as `hf auth login` does (huggingface_hub's
    login); HubError when the Hub refuses the token or cannot be reached."""
    token = token.strip()
    if not token:
        raise HubError("paste a token: create a read token on https://huggingface.co/settings/tokens")
    try:
        login(token=token, add_to_git_credential=False)
    except ValueError as exc:  # an organisation token
        raise HubError(f"{exc}") from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise HubError(
            f"the Hub did not accept that token (HTTP {status}): copy it again from "
            "https://huggingface.co/settings/tokens"
        ) from None
    except httpx.TransportError as exc:
        raise HubError(f"cannot reach the Hub to check the token ({type(exc).__name__}); try again") from None


def _model_files(plan: Plan) -> ModelFiles:
    paths: dict[str, Path | None] = {"target": None, "drafter": None, "tokenizer": None, "mmproj": None}
    for part in plan.parts:
        if part.path is not None:
            paths[part.role] = part.path
            continue
        first = part.files[0]
        snapshot = _storage(plan.cache_dir, first.repo) / "snapshots" / first.commit
        paths[part.role] = snapshot / first.filename if part.source.kind in ("gguf", "mmproj") else snapshot
    return ModelFiles(paths["target"], paths["drafter"], paths["tokenizer"], paths["mmproj"])  # type: ignore[arg-type]


def _check_disk(plan: Plan, disk_free: Callable[[Path], int]) -> None:
    need = plan.missing_bytes()
    if need == 0:
        return
    where = _existing_parent(plan.cache_dir)
    free = disk_free(where)
    if free < need + DISK_MARGIN:
        raise NotEnoughDiskError(
            f"not enough disk space in {plan.cache_dir}: the download needs {size_text(need)}, "
            f"{size_text(free)} is free. Free some space, or point HF_HUB_CACHE at a bigger disk."
        )


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def _existing_parent(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path.cwd()


def _fetch(plan: Plan, file: RemoteFile, report: ProgressCallback, cancel: threading.Event) -> None:
    if cancel.is_set():
        raise DownloadCancelled()
    blob = _blob(plan.cache_dir, file.repo, file.etag)
    partial = _partial(plan.cache_dir, file)
    blob.parent.mkdir(parents=True, exist_ok=True)
    digest = _Digest(file)
    start = partial.stat().st_size if partial.exists() else 0
    if start > file.size:  # longer than the file: not ours to continue
        partial.unlink()
        start = 0
    if start:
        report(Progress(file, start, file.size, status="resuming"))
        digest.update_from(partial, cancel)
    meter = _Meter(file, start, report)
    stalled = 0
    while True:
        before = digest.length
        try:
            _stream_into(plan, file, partial, digest, meter, cancel)
        except (httpx.TransportError, _ShortRead) as exc:
            stalled = 0 if digest.length > before else stalled + 1
            if stalled >= MAX_STALLED_ATTEMPTS:
                raise HubError(
                    f"download of {file.filename} from {file.repo} keeps failing ({exc}); "
                    "the partial file is kept: run again to resume"
                ) from None
            time.sleep(RETRY_WAIT * 2 ** max(0, stalled - 1))
            continue
        break
    report(Progress(file, file.size, file.size, status="verifying"))
    digest.check(partial)
    os.replace(partial, blob)
    _link(plan, file)
    meter.finish()


class _ShortRead(Exception):
    """The server ended the body before the file's end: retried like a dropped connection."""


def _stream_into(plan, file, partial: Path, digest: "_Digest", meter: "_Meter", cancel) -> None:
    start = digest.length
    url = hf_hub_url(file.repo, file.filename, revision=file.commit, endpoint=plan.endpoint)
    headers = build_hf_headers(token=plan.token)
    headers["Accept-Encoding"] = "identity"  # byte ranges of the file itself, not of a gzip stream
    if start:
        headers["Range"] = f"bytes={start}-"
    timeout = constants.HF_HUB_DOWNLOAD_TIMEOUT
    with get_session().stream("GET", url, headers=headers, timeout=timeout, follow_redirects=True) as response:
        if response.status_code == 416 and start == file.size:
            return
        if response.status_code == 429 or response.status_code >= 500:
            raise _ShortRead(f"HTTP {response.status_code}")  # the Hub is busy: retried
        try:
            hf_raise_for_status(response)
        except HfHubHTTPError as exc:
            raise _refused(file, response.status_code, exc, plan.endpoint) from None
        if start and (response.status_code != 206 or not _range_starts_at(response, start)):
            digest.reset()  # the server sent the whole file: start over
            start = 0
            meter.restart()
        with partial.open("r+b" if partial.exists() else "wb") as out:
            out.seek(start)
            out.truncate()
            for chunk in response.iter_bytes():  # as it arrives: a break loses nothing written
                if cancel.is_set():
                    raise DownloadCancelled()
                out.write(chunk)
                digest.update(chunk)
                meter.advance(len(chunk))
    if digest.length < file.size:
        raise _ShortRead(f"got {digest.length} of {file.size} bytes")
    if digest.length > file.size:
        partial.unlink()
        raise HubError(
            f"{file.filename} from {file.repo} came back larger than the listing says; the file was removed: run again"
        )


def _refused(file: RemoteFile, status: int, exc: Exception, endpoint: str) -> HubError:
    if isinstance(exc, GatedRepoError):
        return GatedRepoAccessError(file.repo, get_token() is not None, endpoint)
    if status in (401, 403):
        hint = "the repo may be gated or private: accept its terms on the Hub and set HF_TOKEN"
    elif status == 404:
        hint = "the repo changed since it was listed: run again"
    else:
        hint = "run again later"
    return HubError(f"the Hub refused {file.filename} from {file.repo} (HTTP {status}); {hint}")


def _range_starts_at(response, start: int) -> bool:
    content_range = response.headers.get("Content-Range", "")
    try:
        return int(content_range.split()[1].split("-")[0]) == start
    except (IndexError, ValueError):
        return False


def _link(plan: Plan, file: RemoteFile) -> None:
    """Put the blob under snapshots/<commit>/ (huggingface_hub does it, finding the blob present)."""
    storage = _storage(plan.cache_dir, file.repo)
    if not (storage / "snapshots" / file.commit / file.filename).exists():
        try:
            hf_hub_download(
                file.repo,
                file.filename,
                revision=file.commit,
                cache_dir=plan.cache_dir,
                endpoint=plan.endpoint,
                token=plan.token,
            )
        except (HfHubHTTPError, LocalEntryNotFoundError, httpx.TransportError) as exc:
            raise HubError(
                f"{file.filename} from {file.repo} is downloaded but could not be linked into the "
                f"cache ({type(exc).__name__}); run again to finish"
            ) from None


def _write_ref(plan: Plan, part: Part) -> None:
    """refs/<revision> -> the commit the part's files came from, so the cache finds them by revision offline."""
    if not part.files or part.source.revision == part.files[0].commit:
        return
    commit = part.files[0].commit
    ref = _storage(plan.cache_dir, part.files[0].repo) / "refs" / part.source.revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    if not ref.exists() or ref.read_text().strip() != commit:
        ref.write_text(commit)


class _Digest:
    """Size and hash of the bytes written so far: sha256 for LFS files, git's blob id otherwise."""

    def __init__(self, file: RemoteFile):
        self.file = file
        self.reset()

    def reset(self) -> None:
        self.length = 0
        if self.file.sha256:
            self._hash = hashlib.sha256()
        else:  # git hashes "blob <size>\0" + content
            self._hash = hashlib.sha1(f"blob {self.file.size}\0".encode())

    def update(self, chunk: bytes) -> None:
        self._hash.update(chunk)
        self.length += len(chunk)

    def update_from(self, path: Path, cancel: threading.Event) -> None:
        with path.open("rb") as handle:
            while chunk := handle.read(CHUNK * 8):
                if cancel.is_set():
                    raise DownloadCancelled()
                self.update(chunk)

    def check(self, partial: Path) -> None:
        expected = self.file.etag
        got = self._hash.hexdigest()
        if self.length != self.file.size or (expected and got != expected):
            partial.unlink(missing_ok=True)
            raise HubError(
                f"{self.file.filename} from {self.file.repo} failed verification (expected "
                f"{self.file.size} bytes, hash {expected}; got {self.length} bytes, hash {got}); "
                "the bad file was removed: run again"
            )


class _Meter:
    """Turns written bytes into Progress reports (speed over a sliding window, ETA), rate-limited."""

    def __init__(self, file: RemoteFile, done: int, report: ProgressCallback):
        self.file, self.done, self.report = file, done, report
        self._samples: deque[tuple[float, int]] = deque([(time.monotonic(), done)])
        self._last = 0.0

    def restart(self) -> None:
        self.done = 0
        self._samples = deque([(time.monotonic(), 0)])

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        self._samples.append((now, self.done))
        while len(self._samples) > 2 and now - self._samples[0][0] > SPEED_WINDOW:
            self._samples.popleft()
        if now - self._last >= PROGRESS_INTERVAL:
            self._last = now
            self.report(self._progress(now))

    def finish(self) -> None:
        self.report(Progress(self.file, self.file.size, self.file.size, self.speed(time.monotonic()), 0.0, "done"))

    def speed(self, now: float) -> float:
        t0, b0 = self._samples[0]
        return (self.done - b0) / (now - t0) if now > t0 else 0.0

    def _progress(self, now: float) -> Progress:
        speed = self.speed(now)
        left = self.file.size - self.done
        eta = left / speed if speed > 0 else None
        return Progress(self.file, self.done, self.file.size, speed, eta)


# --- cache layout -----------------------------------------------------------------------------------


def _storage(cache: Path, repo: str) -> Path:
    return cache / repo_folder_name(repo_id=repo, repo_type="model")


def _blob(cache: Path, repo: str, etag: str | None) -> Path:
    return _storage(cache, repo) / "blobs" / (etag or "unknown")


def _partial(cache: Path, file: RemoteFile) -> Path:
    """Where a download in progress lives: blobs/<etag>.incomplete, the name huggingface_hub used."""
    blob = _blob(cache, file.repo, file.etag)
    return blob.with_name(blob.name + ".incomplete")


def _partial_size(cache: Path, file: RemoteFile) -> int:
    try:
        return _partial(cache, file).stat().st_size
    except OSError:
        return 0


def _complete(path: Path, size: int) -> bool:
    try:
        return path.is_file() and path.stat().st_size == size
    except OSError:
        return False


__all__ = [
    "DownloadCancelled",
    "GatedRepoAccessError",
    "HubError",
    "MissingFilesError",
    "ModelFiles",
    "NotEnoughDiskError",
    "OfflineError",
    "Part",
    "Plan",
    "Progress",
    "RemoteFile",
    "cached_parts",
    "check_access",
    "download",
    "fetch",
    "plan",
    "save_token",
]
