"""The error tree drawn in ``protocol/errors.py``'s docstring is the class tree: every class,
its parent, module, status and code, and no class left out of the drawing."""

from __future__ import annotations

import importlib
import re

import protocol.errors
from protocol.errors import SyncdError

_LINE = re.compile(r"^(?P<indent>[ │├└─]*?)(?P<name>[A-Za-z]+)\s+(?P<status>\d{3}|4xx/5xx)\s+"
                   r"(?P<code>[a-z_]+)(?:\s+(?P<module>[a-z_.]+))?")


def _drawn() -> dict[str, tuple[str | None, str, str, str]]:
    """``name -> (parent, module, status, code)`` as the docstring draws them."""
    doc = protocol.errors.__doc__ or ""
    lines = doc[doc.index("    SyncdError"):].splitlines()
    drawn: dict[str, tuple[str | None, str, str, str]] = {}
    parents: list[str] = []  # the open branch, one name per depth
    module = ""
    for line in lines:
        found = _LINE.match(line.removeprefix("    "))
        if found is None:
            continue
        depth = len(found["indent"]) // 4
        del parents[depth:]
        module = found["module"] or module
        drawn[found["name"]] = (parents[-1] if parents else None, module, found["status"],
                                found["code"])
        parents.append(found["name"])
    return drawn


def _classes() -> dict[str, type[SyncdError]]:
    found: dict[str, type[SyncdError]] = {}
    stack: list[type[SyncdError]] = [SyncdError]
    while stack:
        kind = stack.pop()
        found[kind.__name__] = kind
        stack.extend(kind.__subclasses__())
    return found


def test_the_drawn_tree_is_the_class_tree() -> None:
    drawn = _drawn()
    for module in {module for _, module, _, _ in drawn.values()}:
        importlib.import_module(module)
    classes = _classes()
    assert sorted(classes) == sorted(drawn)
    for name, (parent, module, status, code) in drawn.items():
        kind = classes[name]
        assert kind.__module__ == module, name
        assert kind.code == code, name
        if status != "4xx/5xx":
            assert str(kind.status) == status, name
        bases = [b.__name__ for b in kind.__bases__ if issubclass(b, SyncdError)]
        assert bases == ([parent] if parent else []), name


def test_every_store_code_keeps_its_status() -> None:
    from local_store import errors

    assert {kind.code: kind.status for kind in (
        errors.ValidationError, errors.NotFoundError, errors.StoreLockedError,
        errors.StoreClosedError, errors.StoreFullError, errors.StoreUnusableError)} == {
        "invalid": 422, "not_found": 404, "store_locked": 503, "store_closed": 503,
        "disk_full": 507, "store_unusable": 500}
