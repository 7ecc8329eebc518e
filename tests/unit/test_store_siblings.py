"""The two stores are siblings of the abstract Store: each defines every transition it declares,
and one that lacks a transition fails when its module is imported, not when it is first used."""

from __future__ import annotations

import ast
import inspect
import types
from pathlib import Path

import pytest

from agent_router.store import PostgresStore, SqliteStore, Store, faults
from agent_router.store import postgres as postgres_module
from agent_router.store import sqlite as sqlite_module

SIBLINGS = (SqliteStore, PostgresStore)


def test_the_contract_declares_every_public_transition_of_both_siblings() -> None:
    assert len(Store.TRANSITIONS) > 40
    assert frozenset(Store.__abstractmethods__) == Store.TRANSITIONS
    for sibling in SIBLINGS:
        public = {
            name
            for name, member in vars(sibling).items()
            if not name.startswith("_") and inspect.isfunction(member)
        }
        assert public == Store.TRANSITIONS, sibling.__name__
        assert not getattr(sibling, "__abstractmethods__", None)


@pytest.mark.parametrize("sibling", SIBLINGS, ids=lambda cls: cls.__name__)
def test_neither_sibling_is_built_on_the_other(sibling: type[Store]) -> None:
    assert sibling.__bases__ == (Store,)


@pytest.mark.parametrize("sibling", SIBLINGS, ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("missing", ["drain", "prune", "mark_published"])
def test_a_copy_of_a_sibling_without_a_transition_is_refused_as_its_class_is_made(
    sibling: type[Store], missing: str
) -> None:
    namespace = {
        name: member
        for name, member in vars(sibling).items()
        if name != missing and name not in {"__dict__", "__weakref__", "_abc_impl"}
    }
    with pytest.raises(TypeError, match=rf"Partial is a store without the transitions {missing}:"):
        type("Partial", (Store,), namespace)


def _without(module: types.ModuleType, cls: str, methods: set[str]) -> types.CodeType:
    """The source of ``module`` with ``methods`` deleted from its class ``cls``, compiled."""
    path = Path(inspect.getfile(module))
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            node.body = [
                member
                for member in node.body
                if not (isinstance(member, ast.FunctionDef) and member.name in methods)
            ]
    return compile(tree, str(path), "exec")


@pytest.mark.parametrize(
    ("module", "cls"),
    [(sqlite_module, "SqliteStore"), (postgres_module, "PostgresStore")],
    ids=["SqliteStore", "PostgresStore"],
)
def test_a_sibling_whose_module_lacks_transitions_fails_at_import(
    module: types.ModuleType, cls: str
) -> None:
    code = _without(module, cls, {"take_over_expired", "send"})
    imported = types.ModuleType(f"{module.__name__}_without")
    with pytest.raises(
        TypeError, match=rf"{cls} is a store without the transitions send, take_over_expired:"
    ):
        exec(code, imported.__dict__)
    # The same source, whole, imports.
    exec(_without(module, cls, set()), types.ModuleType(module.__name__).__dict__)


def test_a_subclass_of_a_sibling_inherits_its_transitions() -> None:
    class Instrumented(SqliteStore):
        pass

    assert Instrumented.drain is not Store.drain


@pytest.mark.parametrize("store", (Store, *SIBLINGS), ids=lambda cls: cls.__name__)
def test_every_public_method_of_each_store_raises_only_the_librarys_errors(
    store: type[Store],
) -> None:
    guarded = faults.guarded(lambda: None).__code__  # the wrapper faults.boundary installs
    public = {
        name: member
        for name, member in vars(store).items()
        if not name.startswith("_") and inspect.isfunction(member)
    }
    assert public
    unguarded = sorted(name for name, member in public.items() if member.__code__ is not guarded)
    assert unguarded == []
