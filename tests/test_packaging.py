"""`pipx install .` from a checkout: the wheel hatchling builds holds everything the app needs.

The wheel is built offline with hatchling's PEP 517 hook (what pip and pipx call), unpacked, and
imported from there, away from the checkout: the demo pair, the themes, the stylesheet and the
catalog must be found where an installed copy looks for them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("hatchling", reason="hatchling builds the wheel (pip install -e '.[test]')")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = "import sys; from hatchling.build import build_wheel; print(build_wheel(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", build, str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return out / done.stdout.strip().splitlines()[-1]


def test_the_wheel_holds_the_demo_pair_themes_stylesheet_and_catalog(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(
        ["git", "ls-files", "dflash_chat/demo_data", "themes"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked, "git lists the demo pair and the themes"
    for path in tracked:
        inside = path if path.startswith("dflash_chat/") else f"dflash_chat/{path}"
        assert inside in names, f"{inside} is missing from {wheel.name}"
    assert {"dflash_chat/ui/app.tcss", "dflash_chat/models/catalog.toml"} <= names
    assert not any(n.startswith("tests/") or "__pycache__" in n for n in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "dflash-chat = dflash_chat.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_installed_copy_finds_its_data(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import json, dflash_chat, dflash_chat.models.demo as demo, dflash_chat.bench.demo_pair as demo_pair\n"
        "from dflash_chat.ui.themes import shipped_themes_dir\n"
        "from dflash_chat.models.catalog import load_catalog\n"
        "from pathlib import Path\n"
        "print(json.dumps({'package': dflash_chat.__file__, 'demo': demo.demo_available(),\n"
        "  'bench_prompts': {k: len(v) for k, v in demo_pair.bench_prompts().items()},\n"
        "  'themes': sorted(p.name for p in shipped_themes_dir().glob('*.toml')),\n"
        "  'themes_dir': str(shipped_themes_dir()),\n"
        "  'tcss': (Path(dflash_chat.__file__).parent / 'ui' / 'app.tcss').is_file(),\n"
        "  'pairs': [p.name for p in load_catalog(Path('absent.toml')).pairs]}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site), "DFLASH_CHAT_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert Path(found["package"]).is_relative_to(site)  # the unpacked wheel, not the checkout
    assert found["demo"] and found["tcss"]
    assert found["bench_prompts"]["raw_code"] and found["bench_prompts"]["prose"]  # bench --demo's own prompts
    assert Path(found["themes_dir"]).is_relative_to(site)
    assert found["themes"] == sorted(p.name for p in (ROOT / "themes").glob("*.toml"))
    assert "qwen3.6-27b" in found["pairs"]
