from __future__ import annotations

import pytest

from tests.runtime.tokenizer_files import load_tokenizer, write_tokenizer


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    return load_tokenizer(write_tokenizer(tmp_path_factory.mktemp("tokenizer")))
