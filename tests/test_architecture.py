"""The floor plan holds: every import in the package points down the layers, and no two modules import each other.

The layers, bottom to top, are the package's folders (docs/architecture.md says what lives where and why). Every
import is read from the source, lazy ones inside functions and ``TYPE_CHECKING`` ones included: a lazy upward
import hides a dependency, it does not remove it. The one cycle allowed is type-only: the registry's modules name
``Config`` in annotations while ``Config`` is built from the registry. And the knob owners' hooks that change the model
are reached through the registry alone, never by an owner's name. The engine's seam stays narrow: ``run_burst`` takes
what changes from burst to burst and one ``BurstOptions`` for the rest, and every driver names its engine by the one
``Engine`` protocol. Records hold outcomes: no record defines its own words or figures, and ``BurstResult`` stays
small. And the public face (``accel_widgets.__all__``) is what the README, the docs and the notebooks use.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "accel_widgets"

#: Bottom to top. A module may import its own room and any room on a lower floor, never a higher one. Rooms on one
#: floor know nothing of each other.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("metrics", "data"),
    ("inputs",),
    ("knobs",),
    ("results",),
    ("engine",),
    ("analysis", "job"),
    ("views",),
    ("search",),
    ("demos",),
    ("panel", "cli"),
    ("__init__", "__main__"),
)
FLOOR = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}

#: The one cycle allowed, because its way back is for type checkers only: ``Config``'s fields come from the
#: registry, and the registry's modules name ``Config`` in their annotations. A cycle is allowed when it breaks
#: once the type-only imports of these modules are taken out.
TYPE_ONLY_TARGETS_ALLOWED = {"accel_widgets.knobs.config"}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (a package's __init__ counts as the package)
    line: int
    type_only: bool
    path: Path


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def known(module: str) -> str | None:
    """``module`` or the nearest package above it that is a file of this package (``from x import name``)."""
    parts = module.split(".")
    while parts:
        candidate = PACKAGE.parent.joinpath(*parts)
        if candidate.with_suffix(".py").exists() or (candidate / "__init__.py").exists():
            return ".".join(parts)
        parts.pop()
    return None


def imports_of(path: Path) -> list[Import]:
    tree = ast.parse(path.read_text())
    source = module_name(path)
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]
    type_blocks = [node for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(
        node.test)]
    type_lines = {n.lineno for block in type_blocks for stmt in block.body for n in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" for alias in node.names]
        for target in targets:
            if not target.startswith("accel_widgets"):
                continue
            resolved = known(target)
            if resolved is not None and resolved != source:
                found.append(Import(source, resolved, node.lineno, node.lineno in type_lines, path))
    return found


def all_imports() -> list[Import]:
    return [imp for path in sorted(PACKAGE.rglob("*.py")) for imp in imports_of(path)]


def test_every_module_lives_in_a_room_of_the_floor_plan() -> None:
    rooms = {room(module_name(path)) for path in PACKAGE.rglob("*.py")}
    assert rooms <= set(FLOOR), f"rooms missing from FLOORS: {sorted(rooms - set(FLOOR))}"


def test_every_import_points_down_the_floors() -> None:
    upward = [f"{imp.path.relative_to(PACKAGE.parent)}:{imp.line}: {imp.source} imports {imp.target}"
              f"{' (type-only)' if imp.type_only else ''}: {room(imp.source)!r} is on floor {FLOOR[room(imp.source)]}, "
              f"{room(imp.target)!r} on floor {FLOOR[room(imp.target)]}; a module may import only its own room "
              "and lower floors"
              for imp in all_imports()
              if room(imp.source) != room(imp.target) and FLOOR[room(imp.target)] >= FLOOR[room(imp.source)]]
    assert not upward, "\n".join(upward)


def test_no_cycles_but_the_allowed_type_only_one() -> None:
    edges: dict[str, set[str]] = {}
    type_only: dict[tuple[str, str], bool] = {}
    for imp in all_imports():
        edges.setdefault(imp.source, set()).add(imp.target)
        key = (imp.source, imp.target)
        type_only[key] = type_only.get(key, True) and imp.type_only
    cycles = [cycle for cycle in strongly_connected(edges) if len(cycle) > 1]
    bad = []
    for cycle in cycles:
        kept = {s: {t for t in edges.get(s, ()) if t in cycle
                    and not (type_only[(s, t)] and t in TYPE_ONLY_TARGETS_ALLOWED)} for s in cycle}
        if not any(len(c) > 1 for c in strongly_connected(kept)):
            continue
        links = [f"{s} -> {t}" + (" (type-only)" if type_only[(s, t)] else "")
                 for s in sorted(cycle) for t in sorted(edges.get(s, ())) if t in cycle]
        bad.append(f"modules importing each other: {', '.join(sorted(cycle))}\n  " + "\n  ".join(links))
    assert not bad, "\n".join(bad)


def strongly_connected(edges: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components of a directed graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in edges.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            components.append(component)

    for node in list(edges):
        if node not in index:
            visit(node)
    return components


#: The owner modules whose hooks change the model, set torch's global flags or read the model's outline, and those
#: hooks: reached only through the registry (``knobs.prepare_model``, ``knobs.global_flags``, ``knobs.model_notes``),
#: so that a new knob that changes the model is its owner, its ``Config`` field and its test, and nothing else.
MODEL_OWNERS = frozenset({"system", "float8", "memory", "compiling", "parallel", "precision"})
MODEL_HOOKS = frozenset({"prepare_model", "convert", "checkpoint_blocks", "compile_blocks", "compile_model",
                         "wrap_model", "model_notes", "global_flags"})
TESTS = Path(__file__).resolve().parent


def owner_hooks_reached(path: Path) -> list[str]:
    """Where ``path`` reaches an owner's model hook by name: ``memory.checkpoint_blocks`` (the module imported under
    any name, or reached as ``knobs.memory``), or ``from ..knobs.memory import checkpoint_blocks``."""
    tree = ast.parse(path.read_text())
    owners: dict[str, str] = {}  # local name -> the owner module it is
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = (node.module or "").split(".")
            for alias in node.names:
                if module[-1] == "knobs" and alias.name in MODEL_OWNERS:
                    owners[alias.asname or alias.name] = alias.name
                elif module[-2:-1] == ["knobs"] and module[-1] in MODEL_OWNERS and alias.name in MODEL_HOOKS:
                    found.append(f"{path}:{node.lineno}: imports {module[-1]}.{alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in MODEL_HOOKS:
            owner = owner_named(ast.unparse(node.value), owners)
            if owner in MODEL_OWNERS:
                found.append(f"{path}:{node.lineno}: calls {owner}.{node.attr}")
    return found


def owner_named(expression: str, owners: dict[str, str]) -> str:
    """The owner module ``expression`` names: a local name of one (``owners``), or ``...knobs.<module>``; else ""."""
    held, _, name = expression.rpartition(".")
    if not held:
        return owners.get(name, "")
    return name if held.endswith("knobs") else ""


def test_only_the_registry_reaches_the_owners_model_hooks() -> None:
    """Outside ``knobs/`` (and the owners' own tests) the model is prepared, the global flags set and the model notes
    read through the registry, which asks every owner in one order: a module that named an owner's hook would have to
    learn of the next knob that changes the model."""
    outside = [path for path in sorted(PACKAGE.rglob("*.py")) if "knobs" not in path.relative_to(PACKAGE).parts]
    outside += [path for path in sorted(TESTS.rglob("*.py")) if "knobs" not in path.relative_to(TESTS).parts]
    reached = [place for path in outside for place in owner_hooks_reached(path)]
    assert not reached, "reach these through accel_widgets.knobs (prepare_model, global_flags, model_notes):\n" + \
        "\n".join(reached)


#: ``run_burst``'s parameters at most: the workload, the config, and what changes from burst to burst (the length, the
#: event stream, Stop, the label), with everything set once and rarely in one ``BurstOptions``.
RUN_BURST_PARAMETERS = 8
#: How an engine was spelled before the ``Engine`` protocol: a callable that says nothing of what it is called with.
UNTYPED_ENGINE = "Callable[..., BurstResult]"


def test_run_burst_keeps_its_parameters_few() -> None:
    """A new option is a field of ``BurstOptions``, not one more keyword every engine, fake and driver must learn."""
    from accel_widgets.engine.launcher import run_burst

    parameters = list(inspect.signature(run_burst).parameters)
    assert len(parameters) <= RUN_BURST_PARAMETERS, (
        f"run_burst takes {len(parameters)} parameters ({', '.join(parameters)}), at most {RUN_BURST_PARAMETERS}: "
        "put what a caller sets once in accel_widgets.engine.request.BurstOptions")


def untyped_engines(path: Path) -> list[str]:
    """Where ``path`` spells an engine as a bare callable (in an annotation, an alias or a default)."""
    tree = ast.parse(path.read_text())
    return [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}" for node in ast.walk(tree)
            if isinstance(node, ast.Subscript) and ast.unparse(node).endswith(UNTYPED_ENGINE)]


def test_engines_are_named_by_the_engine_protocol() -> None:
    """The searches and the panel take ``engine: Engine`` (accel_widgets.engine.launcher): one place says what a
    burst is called with, so a driver that passes a keyword no engine takes is caught by reading its annotation."""
    spelled = [place for path in sorted(PACKAGE.rglob("*.py")) for place in untyped_engines(path)]
    assert not spelled, f"name these engines accel_widgets.engine.launcher.Engine, not {UNTYPED_ENGINE}:\n" + \
        "\n".join(spelled)


#: The folders whose classes are records: what a burst, a comparison or a search measured. How a record reads (its
#: words, its figures) is the views', so every face says and draws the same thing.
RECORD_ROOMS = ("results", "search")
#: What a record's reading would be called, were it a method of the record.
READINGS = frozenset({"summary", "figure"})
#: The most members ``BurstResult`` may have (:func:`test_burst_result_holds_outcomes_not_readings` counts them).
BURST_RESULT_MEMBERS = 45


def record_readings(path: Path) -> list[str]:
    """Where a class in ``path`` defines a method (or property) named as a reading: ``file:line: Class.summary``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            found += [f"{path.relative_to(PACKAGE.parent)}:{item.lineno}: {node.name}.{item.name}" for item in node.body
                      if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name in READINGS]
    return found


def test_records_hold_no_words_and_no_figures() -> None:
    """A record in ``results/`` or ``search/`` defines no ``summary`` or ``figure``: its words are
    ``accel_widgets.views.text.summary`` (``aw.summary``) and its figures ``accel_widgets.views.figures``, one reading
    shared by the panel, the CLI and the report."""
    paths = [path for room in RECORD_ROOMS for path in sorted((PACKAGE / room).rglob("*.py"))]
    readings = [place for path in paths for place in record_readings(path)]
    assert not readings, "move these readings to accel_widgets/views/ (text.py, figures.py):\n" + "\n".join(readings)


def test_burst_result_holds_outcomes_not_readings() -> None:
    """``BurstResult`` has at most ``BURST_RESULT_MEMBERS`` members: its dataclass fields, and every name its class
    body defines (``vars(BurstResult)``: methods, properties, class methods, private helpers) except dunders, each name
    counted once. It holds the records and the outcomes every face reads; a reading (how the burst used the machine,
    how it compares, how it reads in words) is a function in the layer that needs it, so the record does not grow
    with every new question asked of it."""
    from dataclasses import fields

    from accel_widgets.results.burst import BurstResult

    defined = {name for name in vars(BurstResult) if not (name.startswith("__") and name.endswith("__"))}
    members = defined | {f.name for f in fields(BurstResult)}
    assert len(members) <= BURST_RESULT_MEMBERS, (
        f"BurstResult has {len(members)} members, more than {BURST_RESULT_MEMBERS}: make the new reading a function of "
        f"a result (accel_widgets/analysis/usage.py, analysis/compare.py, views/text.py):\n{sorted(members)}")


#: Where the public face is used and documented: the README, the docs and the notebooks' cells.
ROOT = PACKAGE.parent
#: ``aw.X`` in that text: a use of the public face.
FACE_USE = re.compile(r"\baw\.(\w+)")


def public_names() -> list[str]:
    """``accel_widgets.__all__``, read from the source: importing the package would start its forkserver."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    (value,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets)]
    return list(ast.literal_eval(value))


def documentation() -> dict[str, str]:
    """Each documenting file's text by its path: the README, ``docs/*.md`` and every notebook's cells (not their
    outputs, which echo whatever ran)."""
    texts = {path: path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        texts[path] = "\n".join("".join(cell["source"]) for cell in json.loads(path.read_text())["cells"])
    return {str(path.relative_to(ROOT)): text for path, text in texts.items()}


def mentioned(name: str, text: str) -> bool:
    """Whether ``text`` names ``name`` as code: ``aw.name``, or in backticks as Markdown spells code (a bare word like
    "compare" or "summary" is English, not a use)."""
    return re.search(rf"(\baw\.|`){re.escape(name)}\b", text) is not None


def test_the_public_face_is_what_the_docs_use() -> None:
    """``__all__`` holds what the README, the docs and the notebooks use (docs/api.md lists it, one line a name), and
    they use no ``aw.X`` beyond it: a name nobody documents belongs in its room, and a use of one that is not exported
    is a broken example. A room itself (``aw.views``) is reachable too."""
    names, texts = public_names(), documentation()
    unused = [name for name in names if not any(mentioned(name, text) for text in texts.values())]
    assert not unused, ("in accel_widgets.__all__ but named nowhere in README.md, docs/*.md or notebooks/*.ipynb: "
                        f"document them (docs/api.md) or import them from their rooms instead: {', '.join(unused)}")
    rooms = {path.stem for path in PACKAGE.iterdir() if path.is_dir() or path.suffix == ".py"}
    strays = sorted({f"{where}: aw.{name}" for where, text in texts.items() for name in FACE_USE.findall(text)
                     if name not in names and name not in rooms and not name.startswith("__")})
    assert not strays, "used as aw.X but not in accel_widgets.__all__: export them or import them from their rooms:\n" \
        + "\n".join(strays)


#: docs/api.md's list of the public face: one ``- `aw.X`: what it is`` line a name.
LISTED = re.compile(r"^- `aw\.(\w+)`:", re.MULTILINE)


def test_docs_api_lists_the_public_face_once_each() -> None:
    """docs/api.md, where the README points for the public face, lists each name of ``__all__`` once, and no other."""
    listed = LISTED.findall((ROOT / "docs" / "api.md").read_text())
    names = public_names()
    assert sorted(listed) == sorted(names), (f"docs/api.md lists {sorted(set(listed) - set(names))} beyond __all__ "
                                             f"and misses {sorted(set(names) - set(listed))}")
    assert len(listed) == len(set(listed)), "docs/api.md lists a name twice"


#: Optional dependencies the package's import must not pull in: each is imported only where it is used.
OPTIONAL_ON_IMPORT = ("ray",)


def test_import_pulls_in_no_optional_dependency() -> None:
    """``import accel_widgets`` imports no optional extra (Ray comes with a cluster burst alone): a user without it
    imports the package, and one with it does not pay its import time for a burst on their own machine."""
    code = (f"import sys, accel_widgets; found = [m for m in {OPTIONAL_ON_IMPORT!r} if m in sys.modules]; "
            "assert not found, found")
    env = {**os.environ, "ACCEL_WIDGETS_PRESTART": "0"}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent, env=env)
