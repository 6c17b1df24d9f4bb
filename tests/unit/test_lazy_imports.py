"""``import deadman`` and the CLI import what they use, not the whole package
(DECISIONS 101): every deadman command and worker process starts with them."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import deadman
import deadman.api


def test_all_names_every_lazy_name() -> None:
    assert sorted(deadman.__all__) == sorted(deadman._HOMES)


@pytest.mark.parametrize("name", deadman.__all__)
def test_every_public_name_is_the_object_its_module_defines(name: str) -> None:
    value = getattr(deadman, name)
    home = importlib.import_module(deadman._HOMES[name])
    assert value is getattr(home, name)
    assert name in dir(deadman)


def test_a_name_the_package_does_not_have_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Clinet'"):
        _ = deadman.Clinet  # type: ignore[attr-defined]
    with pytest.raises(ImportError):
        exec("from deadman import Clinet")
    with pytest.raises(AttributeError, match="no attribute 'create'"):
        _ = deadman.api.create  # type: ignore[attr-defined]
    from deadman.api import create_app
    from deadman.api.app import create_app as defined

    assert create_app is defined


def _imported_after(statement: str) -> set[str]:
    """The top-level packages loaded by ``statement`` in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", f"import sys; {statement}; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return {name.split(".")[0] for name in out.split()}


def test_import_deadman_loads_neither_the_driver_nor_the_web_stack() -> None:
    loaded = _imported_after("import deadman")
    assert not loaded & {"psycopg", "starlette", "pydantic", "structlog"}, loaded


def test_the_command_line_loads_no_web_stack() -> None:
    loaded = _imported_after("import deadman.cli")
    assert not loaded & {"starlette", "uvicorn", "jinja2"}, loaded
