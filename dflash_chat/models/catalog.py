"""The model pairs dflash-chat knows: the shipped catalog.toml plus the user's own.
One file past 500 lines: one schema's checks, for catalog.toml and the user's pairs; split, each half needs the other.

A pair is a target model, the DFlash drafter trained for it and the official
repo holding the tokenizer and chat template. Each part comes from a `Source`:
files matched by pattern in a Hub repo, or a path on this machine.

Users add pairs (or change shipped ones) in config.toml, with the same keys as
catalog.toml under `[models.NAME]` instead of `[pairs.NAME]`:

    [models.my-27b]                      # my own GGUFs, shapes from a shipped pair
    extends = "qwen3.6-27b"
    title = "Qwen3.6-27B (LM Studio files)"
    target = { path = "~/models/Qwen3.6-27B-Q5_K_M.gguf" }
    drafter = { path = "~/models/Qwen3.6-27B-DFlash-q8_0.gguf" }

    [models."qwen3.6-27b".target]        # another uploader's quants for a shipped pair
    repo = "someone/Qwen3.6-27B-GGUF"
    revision = "main"

`extends` copies a pair and overlays the keys given (tables merge key by key);
a [models.NAME] with a shipped pair's name overlays that pair. The target's vision tower is
`target.vision` (its shape) and `target.mmproj` (its GGUF: a `pattern` in the target's repo, or a
`path`), e.g. `[models."qwen3.6-27b".target] mmproj = { path = "~/models/mmproj-F16.gguf" }`.

Shipped sources are pinned to a commit, so the file the picker sized is the file that downloads.
A drafter repo can hold several trainings of the drafter (z-lab retrained the 35B-A3B one): the
drafter section names each under `versions` with its shape, and each quant says which `version`
its file is. A local drafter file of a pair with several versions is sized as the largest.

The reader of catalog.toml and of the user's file is one set of checks (every key's type, range and one-line
error) over one schema.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from dataclasses import MISSING, dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from dflash_chat import paths
from dflash_chat.engine.memory import DrafterShape, TargetShape, VisionShape, drafter_cache_rows
from dflash_chat.errors import UserError
from dflash_chat.models.sizes import GB

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

# Tokenizer repos: tokenizer_config.json must be there; the rest is fetched when present.
TOKENIZER_PATTERNS = ("tokenizer_config.json",)
TOKENIZER_EXTRAS = (
    "tokenizer.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
    "generation_config.json",
    "config.json",
)
SAFETENSORS_PATTERNS = ("config.json", "*.safetensors")
SAFETENSORS_EXTRAS = ("model.safetensors.index.json", "generation_config.json", "preprocessor_config.json")

# Bits per weight of common GGUF quants, to estimate the size of a quant the catalog does not list.
BITS_PER_WEIGHT = {
    "F32": 32.0,
    "BF16": 16.0,
    "F16": 16.0,
    "Q8_0": 8.5,
    "Q6_K": 6.56,
    "Q5_K_M": 5.69,
    "Q5_K_S": 5.54,
    "Q5_0": 5.5,
    "Q4_K_M": 4.89,
    "Q4_K_S": 4.58,
    "Q4_0": 4.5,
    "IQ4_XS": 4.25,
    "IQ4_NL": 4.5,
    "Q3_K_L": 4.27,
    "Q3_K_M": 3.91,
    "Q3_K_S": 3.5,
    "Q2_K": 3.35,
}
COMMIT = re.compile(r"^[0-9a-f]{40}$")
_LONG_CONTEXT = 2**18

_QUANT_TOKEN = re.compile(r"^(I?Q\d(_[A-Z0-9]+)*|BF16|F16|F32|MXFP4\w*)$", re.IGNORECASE)
_SPLIT_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$", re.IGNORECASE)


class CatalogError(UserError):
    """A pair or quant is unknown, or a catalog/config entry is malformed."""


@dataclass(frozen=True)
class Source:
    """Where one part of a pair comes from: files matched in a Hub repo, or a local path."""

    kind: str  # "gguf", "safetensors", "tokenizer" or "mmproj" (a vision tower's GGUF)
    quant: str = ""
    repo: str | None = None
    revision: str = "main"
    patterns: tuple[str, ...] = ()  # each must match at least one file of the repo
    extras: tuple[str, ...] = ()  # fetched when the repo has them
    path: Path | None = None
    size: int = 0  # approximate bytes, until a listing says
    shape: DrafterShape | None = None  # a drafter source: the shape of the weights it holds
    version: str = ""  # a drafter source: which training of the drafter its file is

    @classmethod
    def local(cls, path: Path, shape: DrafterShape | None = None) -> Source:
        """A model file or checkpoint folder on disk; its quant is read from the name ('local' if none)."""
        kind = "gguf" if path.suffix.lower() == ".gguf" else "safetensors"
        return cls(kind, quant_of(path.name) or "local", path=path, size=local_size(path), shape=shape)

    def describe(self) -> str:
        if self.path is not None:
            return str(self.path)
        return f"{self.repo} {' '.join(self.patterns)}"

    @property
    def local_path(self) -> Path:
        """The path of a source on disk (`local`)."""
        if self.path is None:
            raise ValueError(f"{self.describe()} is not a local path")
        return self.path

    @property
    def hub_repo(self) -> str:
        """The Hub repo of a source that is not a local path."""
        if self.repo is None:
            raise ValueError(f"{self.describe()} names no Hub repo")
        return self.repo


@dataclass(frozen=True)
class Pair:
    name: str
    title: str
    rank: int
    cpu_default: bool
    default_context: int
    max_context: int
    target_shape: TargetShape
    drafter_versions: tuple[tuple[str, DrafterShape], ...]  # (name, shape) of each training of the drafter
    targets: tuple[Source, ...]  # in order of preference
    drafters: tuple[Source, ...]  # in order of preference; empty: plain decoding
    tokenizer: Source
    target_repo: str | None = None
    origin: str = "catalog"
    mtp_first: bool = False  # the target's own MTP layer drafts before a DFlash drafter is even downloaded
    vision: VisionShape | None = None  # the target's vision tower (`target.vision`); None: it reads no images
    mmproj: Source | None = None  # the tower's mmproj GGUF beside a GGUF target (`target.mmproj`)

    @property
    def has_mtp(self) -> bool:
        """Its target's checkpoints carry their own MTP layer (`shape.mtp`)."""
        return self.target_shape.mtp

    def vision_source(self, target: Source) -> Source | None:
        """Where `target`'s vision tower comes from: its own folder (a safetensors checkpoint holds
        `model.visual.*`), else the pair's mmproj file; None when the pair has no tower."""
        if self.vision is None:
            return None
        if target.kind == "safetensors":
            return target
        return self.mmproj

    @property
    def target_quants(self) -> tuple[str, ...]:
        return tuple(s.quant for s in self.targets)

    @property
    def drafter_quants(self) -> tuple[str, ...]:
        return tuple(s.quant for s in self.drafters)

    def target(self, quant: str) -> Source:
        """The target source for `quant`; another llama.cpp quant is looked up in the repo by pattern."""
        if found := _find(self.targets, quant):
            return found
        listed = ", ".join(self.target_quants)
        if not is_quant_name(quant):
            raise CatalogError(
                f"{quant} is not a quant llama.cpp writes (e.g. Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q3_K_S, "
                f"IQ4_XS); {self.title} lists {listed}"
            )
        if self.target_repo is None:
            raise CatalogError(f"{self.title} has no quant {quant} (it has {listed})")
        return Source(
            kind="gguf",
            quant=quant.upper(),
            repo=self.target_repo,
            revision=next((s.revision for s in self.targets if s.repo == self.target_repo), "main"),
            patterns=(f"*{quant}*.gguf",),
            size=_estimated_size(self.targets, quant),
        )

    def drafter(self, quant: str) -> Source:
        if found := _find(self.drafters, quant):
            return found
        have = ", ".join(self.drafter_quants) or "none"
        raise CatalogError(f"{self.title} has no drafter quant {quant} (it has {have})")

    def local_drafter(self, path: Path) -> Source:
        """A drafter file of this pair on disk, sized as the largest version of the drafter (its
        training cannot be told from the name)."""
        return Source.local(path, _largest(self.drafter_versions))


def _find(sources: tuple[Source, ...], quant: str) -> Source | None:
    return next((s for s in sources if s.quant.lower() == quant.lower()), None)


@dataclass(frozen=True)
class Catalog:
    pairs: tuple[Pair, ...]

    def get(self, name: str) -> Pair:
        wanted = name.strip().lower()
        for pair in self.pairs:
            if wanted in (pair.name.lower(), pair.title.lower()):
                return pair
        known = ", ".join(p.name for p in self.pairs)
        raise CatalogError(f"unknown model {name!r}; known models: {known} (see `dflash-chat models`)")

    def ranked(self) -> tuple[Pair, ...]:
        return tuple(sorted(self.pairs, key=lambda p: -p.rank))


def is_quant_name(name: str) -> bool:
    """A quant llama.cpp's quantizer writes (gguf's LlamaFileType names: Q3_K_S, IQ4_XS, ...), optionally as
    unsloth's dynamic variants (a UD- prefix, or Qn_K_XL)."""
    from gguf import LlamaFileType  # numpy: not on the --help path

    base = name.strip().upper().removeprefix("UD-")
    known = {t.name.split("_", 1)[1] for t in LlamaFileType if t.name != "GUESSED"}
    return base in known or re.fullmatch(r"Q[2-8]_K_XL", base) is not None


def quant_of(filename: str) -> str | None:
    """The quant named in a GGUF file name ('Qwen3.6-27B-UD-Q4_K_XL.gguf' -> 'UD-Q4_K_XL')."""
    stem = _SPLIT_SUFFIX.sub("", Path(filename).name.removesuffix(".gguf"))
    tokens = re.split(r"[-.]", stem)
    for i in range(len(tokens) - 1, -1, -1):
        if _QUANT_TOKEN.match(tokens[i]):
            quant = tokens[i].upper()
            return f"UD-{quant}" if i > 0 and tokens[i - 1].upper() == "UD" else quant
    return None


def split_group(filename: str) -> str:
    """The name shared by every part of a split GGUF ('x-00001-of-00003.gguf' -> 'x')."""
    return _SPLIT_SUFFIX.sub("", filename.removesuffix(".gguf"))


def matches(filename: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(filename.lower(), pattern.lower())


def load_catalog(config_path: Path | None = None) -> Catalog:
    """The shipped pairs, with the user's [models.*] from config.toml added or overlaid."""
    shipped = _read_toml_text(
        resources.files("dflash_chat.models").joinpath("catalog.toml").read_text("utf-8"), "catalog.toml"
    ).get("pairs", {})
    config_path = config_path or paths.config_file()
    user = _read_user_models(config_path)
    tables: dict[str, tuple[dict[str, Any], str]] = {name: (table, "catalog") for name, table in shipped.items()}
    for name, table in user.items():
        if not isinstance(table, dict):
            raise CatalogError(f"{config_path}: [models.{name}] must be a table")
        table = dict(table)
        base_name = table.pop("extends", None)
        if base_name is not None:
            base = _find_table(tables, str(base_name), config_path, name)
        else:
            base = tables.get(name, ({}, ""))[0]
        tables[name] = (_merge(base, table), str(config_path))
    return Catalog(tuple(_pair(name, table, origin) for name, (table, origin) in tables.items()))


def _find_table(tables, base_name: str, config_path: Path, name: str) -> dict[str, Any]:
    if base_name in tables:
        return tables[base_name][0]
    known = ", ".join(tables)
    raise CatalogError(f"{config_path}: [models.{name}] extends unknown model {base_name!r}; known models: {known}")


def _read_user_models(config_path: Path) -> dict[str, Any]:
    try:
        text = config_path.read_text("utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:  # a folder, not UTF-8, unreadable: one line, not a traceback
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise CatalogError(f"{config_path} cannot be read ({reason}); fix or move it") from None
    models = _read_toml_text(text, str(config_path)).get("models", {})
    if not isinstance(models, dict):
        raise CatalogError(f"{config_path}: `models` must be a table of [models.NAME] entries")
    return models


def _read_toml_text(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{where} is not valid TOML ({exc}); fix or delete it") from None


def _merge(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    if "repo" in overlay and "revision" not in overlay:
        merged.pop("revision", None)  # the shipped pin belongs to the shipped repo
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# --- parsing one pair ---------------------------------------------------------------------------

_PAIR_KEYS = {
    "title",
    "rank",
    "cpu_default",
    "default_context",
    "max_context",
    "tokenizer",
    "target",
    "drafter",
    "mtp_first",
}
_SOURCE_KEYS = {"repo", "revision", "pattern", "format", "size_gb", "path"}


class _Reader:
    """Typed access to one pair's table; every error names the table and the key."""

    def __init__(self, name: str, origin: str):
        self.where = f"{origin}: [{'pairs' if origin == 'catalog' else 'models'}.{name}]"

    def fail(self, problem: str) -> CatalogError:
        return CatalogError(f"{self.where} {problem}")

    def get(self, table: Mapping[str, Any], key: str, kind: type, default: Any = ..., at: str = ""):
        if key not in table:
            if default is ...:
                raise self.fail(f"needs `{at}{key}`")
            return default
        value = table[key]
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise self.fail(f"`{at}{key}` must be a whole number, got {value!r}")
        if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise self.fail(f"`{at}{key}` must be a number, got {value!r}")
        if kind in (str, bool, dict) and not isinstance(value, kind):
            raise self.fail(f"`{at}{key}` must be {kind.__name__}, got {value!r}")
        return value

    def only(self, table: Mapping[str, Any], allowed: set[str], at: str = "") -> None:
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise self.fail(f"has unknown key `{at}{unknown[0]}` (known: {', '.join(sorted(allowed))})")


def _pair(name: str, table: dict[str, Any], origin: str) -> Pair:
    r = _Reader(name, origin)
    r.only(table, _PAIR_KEYS)
    target = r.get(table, "target", dict)
    drafter = dict(r.get(table, "drafter", dict, {}))
    versions = _drafter_versions(r, drafter)
    target = dict(target)
    vision = _vision(r, target)
    mmproj = _mmproj_source(r, target.pop("mmproj", None), target)
    targets, target_repo = _sources(r, target, "target.", required=True)
    drafters = _sources(r, drafter, "drafter.", required=False, versions=versions)[0]
    default_context = r.get(table, "default_context", int, 32768)
    pair = Pair(
        name=name,
        title=r.get(table, "title", str, name),
        rank=r.get(table, "rank", int, 0),
        cpu_default=r.get(table, "cpu_default", bool, False),
        default_context=default_context,
        max_context=r.get(table, "max_context", int, default_context),
        target_shape=_shape(r, TargetShape, r.get(target, "shape", dict, at="target."), "target.shape."),
        drafter_versions=versions,
        targets=targets,
        drafters=drafters,
        tokenizer=_tokenizer_source(r, table.get("tokenizer")),
        target_repo=target_repo,
        origin=origin,
        mtp_first=r.get(table, "mtp_first", bool, False),
        vision=vision,
        mmproj=mmproj,
    )
    if mmproj is not None and vision is None:
        raise r.fail("has `target.mmproj` but no `target.vision` (the tower's shape, which sizes it)")
    if pair.mtp_first and not pair.has_mtp:
        raise r.fail("has `mtp_first = true` but its target has no MTP layer: add `mtp = true` to `target.shape`")
    if origin == "catalog":
        _check_pinned(r, pair)
    return pair


def _vision(r: _Reader, target: dict[str, Any]) -> VisionShape | None:
    """The target's vision tower (`target.vision`, a VisionShape's fields); pops the key."""
    table = r.get(target, "vision", dict, None, at="target.")
    target.pop("vision", None)
    if table is None:
        return None
    shape = _shape(r, VisionShape, table, "target.vision.")
    bad = [f.name for f in fields(VisionShape) if getattr(shape, f.name) < 1]
    if bad or shape.hidden % shape.heads:
        problem = f"{bad[0]} must be at least 1" if bad else f"hidden {shape.hidden} is not a multiple of heads"
        raise r.fail(f"`target.vision`: {problem}")
    return shape


def _mmproj_source(r: _Reader, spec: Any, target: Mapping[str, Any]) -> Source | None:
    """`target.mmproj`: the vision tower's GGUF, by pattern in the target's repo (or its own) or a local path."""
    if spec is None:
        return None
    at = "target.mmproj."
    if not isinstance(spec, dict):
        raise r.fail('`target.mmproj` must be a table like { pattern = "mmproj-*F16*.gguf" }')
    r.only(spec, _SOURCE_KEYS - {"format"}, at)
    if "path" in spec:
        return replace(_local_source(r, spec, at), kind="mmproj", quant="")
    repo = r.get(spec, "repo", str, target.get("repo"), at=at)
    if repo is None:
        raise r.fail(f"needs `{at}repo` (or the target's `repo`)")
    default_revision = target.get("revision", "main") if repo == target.get("repo") else "main"
    return Source(
        "mmproj",
        "",
        repo,
        r.get(spec, "revision", str, default_revision, at=at),
        (r.get(spec, "pattern", str, at=at),),
        size=int(r.get(spec, "size_gb", float, 0, at=at) * GB),
    )


def _drafter_versions(r: _Reader, drafter: dict[str, Any]) -> tuple[tuple[str, DrafterShape], ...]:
    """The drafter's trainings: `versions.NAME = { shape = {...} }`, or one unnamed `shape`.
    Pops both keys from `drafter` (the rest are its sources)."""
    versions = r.get(drafter, "versions", dict, {}, at="drafter.")
    shape = r.get(drafter, "shape", dict, None, at="drafter.")
    drafter.pop("versions", None)
    drafter.pop("shape", None)
    if versions and shape is not None:
        raise r.fail("has both `drafter.shape` and `drafter.versions`; give each version its shape")
    if shape is not None:
        return (("", _shape(r, DrafterShape, shape, "drafter.shape.")),)
    out = []
    for version, spec in versions.items():
        at = f"drafter.versions.{version}."
        if not isinstance(spec, dict):
            raise r.fail(f"`{at.rstrip('.')}` must be a table like {{ shape = {{...}} }}")
        r.only(spec, {"shape", "weights"}, at)
        r.get(spec, "weights", str, "", at=at)
        out.append((version, _shape(r, DrafterShape, r.get(spec, "shape", dict, at=at), f"{at}shape.")))
    return tuple(out)


def _largest(versions: tuple[tuple[str, DrafterShape], ...]) -> DrafterShape | None:
    """The version whose context cache is the largest at a long context (the safe one to size by)."""

    def cache_width(shape: DrafterShape) -> int:
        return sum(drafter_cache_rows(shape, _LONG_CONTEXT, shape.block_size)) * shape.kv_heads * shape.head_dim

    return max((shape for _, shape in versions), key=cache_width, default=None)


def _check_pinned(r: _Reader, pair: Pair) -> None:
    """Shipped Hub sources name a commit: the listing the picker sized must not move under it."""
    for source in (*pair.targets, *pair.drafters, pair.tokenizer, *((pair.mmproj,) if pair.mmproj else ())):
        if source.repo is not None and not COMMIT.match(source.revision):
            raise r.fail(f"source {source.repo} must be pinned to a 40-hex commit, not {source.revision!r}")


def _shape(r: _Reader, cls, table: Mapping[str, Any], at: str):
    """A shape dataclass from its table: whole numbers (a text field, such as a drafter's `kind`, as
    text), the dataclass's defaults for keys left out; a drafter shape must be one the memory model
    can size (DrafterShape.problem)."""
    known = fields(cls)
    r.only(table, {f.name for f in known}, at)
    values = {}
    for f in known:
        default = ... if f.default is MISSING else f.default
        kind = str if f.type in (str, "str") else bool if f.type in (bool, "bool") else int
        values[f.name] = r.get(table, f.name, kind, default, at=at)
    shape = cls(**values)
    problem = shape.problem() if isinstance(shape, DrafterShape) else None
    if problem:
        raise r.fail(f"`{at.rstrip('.')}`: {problem}")
    return shape


def _sources(
    r: _Reader, table: Mapping[str, Any], at: str, required: bool, versions: tuple = ()
) -> tuple[tuple[Source, ...], str | None]:
    """One section's sources and its repo; a target section must name a repo and quants, a drafter need not."""
    r.only(table, {"repo", "revision", "shape", "quants", "path"}, at)
    largest = _largest(versions)
    if "path" in table:
        return (replace(_local_source(r, table, at), shape=largest),), None
    repo = r.get(table, "repo", str, ... if required else None, at=at)
    revision = r.get(table, "revision", str, "main", at=at)
    quants = r.get(table, "quants", dict, ... if required else {}, at=at)
    if required and not quants:
        raise r.fail(f"needs at least one entry in `{at}quants`")
    sources = tuple(
        _quant_source(r, quant, spec, repo, revision, f"{at}quants.{quant}.", versions)
        for quant, spec in quants.items()
    )
    return sources, repo


def _version_of(r: _Reader, spec: Mapping[str, Any], versions: tuple, at: str) -> tuple[str, DrafterShape | None]:
    """The (version, shape) a drafter quant's file holds; the only version when it names none."""
    if not versions:
        return "", None
    named = dict(versions)
    if "version" not in spec:
        if len(versions) > 1:
            raise r.fail(f"needs `{at}version` (one of: {', '.join(named)}): which drafter its file holds")
        return versions[0]
    version = r.get(spec, "version", str, at=at)
    if version not in named:
        raise r.fail(f"`{at}version` is {version!r}; the drafter's versions are: {', '.join(named)}")
    return version, named[version]


def _quant_source(
    r: _Reader, quant: str, spec: Any, repo: str | None, revision: str, at: str, versions: tuple = ()
) -> Source:
    if not isinstance(spec, dict):
        raise r.fail(f'`{at.rstrip(".")}` must be a table like {{ pattern = "*{quant}*.gguf" }}')
    r.only(spec, _SOURCE_KEYS | ({"version"} if versions else set()), at)
    version, shape = _version_of(r, spec, versions, at)
    if "path" in spec:
        return replace(_local_source(r, spec, at), quant=quant, shape=shape, version=version)
    repo = r.get(spec, "repo", str, repo, at=at)
    if repo is None:
        raise r.fail(f"needs `{at}repo` (or a `repo` for the whole section)")
    size = int(r.get(spec, "size_gb", float, 0, at=at) * GB)
    revision = r.get(spec, "revision", str, revision, at=at)
    fmt = r.get(spec, "format", str, "gguf", at=at)
    if fmt == "safetensors":
        return Source(
            "safetensors",
            quant,
            repo,
            revision,
            SAFETENSORS_PATTERNS,
            SAFETENSORS_EXTRAS,
            size=size,
            shape=shape,
            version=version,
        )
    if fmt != "gguf":
        raise r.fail(f'`{at}format` must be "gguf" or "safetensors", got {fmt!r}')
    pattern = r.get(spec, "pattern", str, at=at)
    return Source("gguf", quant, repo, revision, (pattern,), size=size, shape=shape, version=version)


def _local_source(r: _Reader, spec: Mapping[str, Any], at: str) -> Source:
    return Source.local(Path(r.get(spec, "path", str, at=at)).expanduser())


def _tokenizer_source(r: _Reader, spec: Any) -> Source:
    if isinstance(spec, str):
        spec = {"repo": spec}
    if not isinstance(spec, dict):
        raise r.fail('needs `tokenizer = "owner/repo"` or `tokenizer = { path = "..." }`')
    r.only(spec, {"repo", "revision", "path"}, "tokenizer.")
    if "path" in spec:
        return Source("tokenizer", path=Path(r.get(spec, "path", str, at="tokenizer.")).expanduser())
    return Source(
        "tokenizer",
        repo=r.get(spec, "repo", str, at="tokenizer."),
        revision=r.get(spec, "revision", str, "main", at="tokenizer."),
        patterns=TOKENIZER_PATTERNS,
        extras=TOKENIZER_EXTRAS,
    )


def local_size(path: Path) -> int:
    """Bytes of a local model file, or of the weight files in a checkpoint folder (0 if absent)."""
    try:
        if path.is_dir():
            return sum(p.stat().st_size for p in path.glob("*.safetensors"))
        return path.stat().st_size
    except OSError:
        return 0


def _estimated_size(known: tuple[Source, ...], quant: str) -> int:
    """Scale a listed quant's size by bits per weight (largest listed size when unknown)."""
    largest = max(known, key=lambda s: s.size)
    bits = BITS_PER_WEIGHT.get(quant.upper().removeprefix("UD-"))
    for source in known:
        ref = BITS_PER_WEIGHT.get(source.quant.upper())
        if bits and ref and source.size:
            return int(source.size * bits / ref)
    return largest.size
