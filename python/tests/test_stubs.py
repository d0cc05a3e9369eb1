"""The type stubs (`braintrace_rs/_native.pyi`) match the native module:
every public name the module has is in the stubs and every name the stubs
declare exists (classes: their public methods and properties too)."""

import ast
import inspect
from pathlib import Path

import braintrace_rs._native as native

STUBS = Path(__file__).resolve().parents[1] / "braintrace_rs" / "_native.pyi"


def stub_names():
    tree = ast.parse(STUBS.read_text())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        if isinstance(node, ast.ClassDef):
            members[node.name] = {
                n.name for n in node.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")
            }
    return top, members


def test_every_native_name_is_in_the_stubs_and_back():
    top, members = stub_names()
    public = {n for n in dir(native) if not n.startswith("__")}
    assert public - top == set(), "in the module, not in the stubs"
    assert {n for n in top if not n[0].isupper() or n in public} - public == set(), "in the stubs only"
    for cls, names in members.items():
        if cls not in public or not inspect.isclass(getattr(native, cls)):
            continue
        have = {n for n in dir(getattr(native, cls)) if not n.startswith("_")}
        assert names - have == set(), f"{cls}: in the stubs, not in the class"
        assert have - names == set(), f"{cls}: in the class, not in the stubs"
