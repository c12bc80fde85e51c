"""What a model module defines, read without running it: a misspelled function in
`model: "nets.tiny:biuld"` is refused at submit instead of after a trainer's cold start.

The module is parsed (`ast`), never imported: no member's code runs in the API. Only what
its top level binds for certain counts (def, class, assignments, imports, and the same
inside top-level if/try/with/for blocks); a module that may bind names no reading shows (a
star import, a module `__getattr__`, `globals()`) is given the benefit of the doubt."""

from __future__ import annotations

import ast
import difflib

MAX_SOURCE_BYTES = 4_000_000
"""Larger modules are not read at submit (the trainer still says what is missing)."""


def top_level_names(source: str) -> set[str] | None:
    """The names the module's top level binds; None when it may bind others unseen.
    Raises SyntaxError when it does not parse."""
    tree = ast.parse(source)
    names: set[str] = set()
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        match node:
            case ast.FunctionDef() | ast.AsyncFunctionDef() | ast.ClassDef():
                names.add(node.name)
            case ast.Import() | ast.ImportFrom():
                for alias in node.names:
                    if alias.name == "*":
                        return None
                    names.add(alias.asname or alias.name.split(".")[0])
            case ast.Assign() | ast.AnnAssign() | ast.AugAssign() | ast.For() | ast.AsyncFor():
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(_bound(targets))
            case ast.With() | ast.AsyncWith():
                names.update(_bound([item.optional_vars for item in node.items if item.optional_vars]))
        for field in ("body", "orelse", "finalbody", "handlers"):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                pending.extend(getattr(node, field, []))
        if isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    if "__getattr__" in names or any(
        isinstance(n, ast.Name) and n.id in ("globals", "vars", "setattr") for n in ast.walk(tree)
    ):
        return None
    return names


def _bound(targets: list[ast.expr]) -> set[str]:
    return {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}


def missing_function(source: str, function: str, path: str) -> str | None:
    """Why `function` cannot come from the module at `path` (shown in the message), or None
    when it is there or may be."""
    try:
        names = top_level_names(source)
    except SyntaxError as err:
        return f"{path} does not parse: line {err.lineno}: {err.msg}"
    except (ValueError, RecursionError):  # a null byte, or nesting deeper than the parser goes
        return None
    if names is None or function in names:
        return None
    near = difflib.get_close_matches(function, sorted(names), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return f"{path} has no function {function!r}{hint}"
