"""What the daemon hands the sync engine to embed memories with the plane's model
(``syncd.daemon.plane_embedder``): bge-small-en-v1.5 from files already under
``embedding.cache_dir``, an error naming what is missing otherwise, nothing for another model."""

from __future__ import annotations

from pathlib import Path

import pytest

from local_store.embed_minilm import EmbedderUnavailable
from syncd.config import parse_config
from syncd.daemon import plane_embedder

ENV = {"HOME": "/home/ada"}


def config(text: str) -> object:
    return parse_config(text.encode(), env=ENV)


def test_a_bge_plane_without_a_cache_dir_names_the_option() -> None:
    build = plane_embedder(config('[control_plane]\nurl = "https://plane.example.com"\n'))
    assert build is not None
    with pytest.raises(EmbedderUnavailable, match=r"embedding\.cache_dir is not set"):
        build()


def test_a_bge_plane_with_an_empty_cache_dir_names_the_missing_files(tmp_path: Path) -> None:
    build = plane_embedder(config(
        f'[control_plane]\nurl = "https://plane.example.com"\n'
        f'[embedding]\ncache_dir = "{tmp_path}"\n'))
    assert build is not None
    with pytest.raises(EmbedderUnavailable) as caught:
        build()
    assert "model_optimized.onnx" in str(caught.value) and str(tmp_path) in str(caught.value)


def test_a_plane_on_another_model_gets_no_plane_embedder() -> None:
    assert plane_embedder(config(
        '[control_plane]\nurl = "https://plane.example.com"\n'
        'embedding_model = "all-MiniLM-L6-v2"\n')) is None
