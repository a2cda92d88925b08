"""Where dflash-chat keeps its files (XDG / platform conventions via platformdirs).

DFLASH_CHAT_HOME overrides all of them (one folder with config/, data/, cache/),
which the tests and portable installs use.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "dflash-chat"


def _home() -> Path | None:
    value = os.environ.get("DFLASH_CHAT_HOME")
    return Path(value) if value else None


def config_dir() -> Path:
    home = _home()
    return home / "config" if home else Path(platformdirs.user_config_dir(APP))


def data_dir() -> Path:
    home = _home()
    return home / "data" if home else Path(platformdirs.user_data_dir(APP))


def cache_dir() -> Path:
    home = _home()
    return home / "cache" if home else Path(platformdirs.user_cache_dir(APP))


def torch_caches() -> dict[str, str]:
    """Where torch keeps what it compiles, under the app's cache folder (torch's own default for inductor is
    TMPDIR, outside the app's folders and gone at a reboot): the variables torch reads, for the environment."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache_dir() / "torchinductor")}


def place_torch_caches(environ=os.environ) -> None:
    """`torch_caches()` into `environ`, unless the user chose their own (torch reads them at first use)."""
    for name, value in torch_caches().items():
        environ.setdefault(name, value)


def config_file() -> Path:
    return config_dir() / "config.toml"


def user_themes_dir() -> Path:
    return config_dir() / "themes"


def history_db() -> Path:
    return data_dir() / "history.sqlite3"
