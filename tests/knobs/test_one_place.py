"""One knob, one place: a knob's field is read, and its values chosen, only in the module that owns it.

Everything the package knows about a knob (what it does to a burst, which values a search tries, the ladder's
rung, the advice the diagnosis gives, the guard's tolerance) lives in its owner (:mod:`accel_widgets.knobs`),
and the rest composes the owners generically. This test reads the package's source: a knob's field read on a
config (``config.num_workers``), a knob named as a keyword (``config.replace(num_workers=2)``) or as a string
(``"num_workers"``) outside its owner fails, unless the allow-list below names the file and the knob with why.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import typing
from pathlib import Path

from accel_widgets import knobs
from accel_widgets.knobs import KNOBS, OWNERS, owner_of
from accel_widgets.knobs.base import STYLES, RecipeContext
from accel_widgets.knobs.config import Config

PACKAGE = Path(__file__).resolve().parents[2] / "accel_widgets"
NAMES = frozenset(KNOBS)  # a set: asking the registry itself about a name that is no knob raises

#: Names a config goes by in the package (a parameter, a loop variable, an attribute of a result or a plan).
CONFIG_NAMES = {"config", "c", "base", "current", "best", "candidate", "start", "draft", "changed", "reference"}

#: (file, knob): why that file may name the knob although it does not own it.
ALLOWED: dict[tuple[str, str], str] = {
    ("search/batchsize.py", "batch_size"): "the batch-size search varies the batch size: it is its subject",
    ("results/batchsize.py", "batch_size"): "the batch-size search's record: each try's batch size is its subject",
    ("views/text.py", "batch_size"): "a batch-size search's words name the sizes it tried",
    ("metrics/flops.py", "tf32"): "the math a FLOP ran in, named as NVIDIA's peak tables name it, not the knob",
    ("data/streams.py", "num_workers"): "torch's WorkerInfo.num_workers, which a stream that splits itself reads",
    ("results/history.py", "batch_size"): "the workload's own batch size in its fingerprint, not the knob",
    ("analysis/guard.py", "world_size"): "the result's ranks, a key of the noise bands stored in the run history",
}


#: The modules of the knobs package, by file name.
KNOB_MODULES = {info.name: importlib.import_module(f"{knobs.__name__}.{info.name}")
                for info in pkgutil.iter_modules(knobs.__path__)}
#: Each owner's file: the module that ends with it.
OWNER_FILES = {module.OWNER: f"knobs/{name}.py" for name, module in KNOB_MODULES.items() if hasattr(module, "OWNER")}


def owner_file(knob: str) -> str:
    return OWNER_FILES[owner_of(knob)]


def config_like(node: ast.expr) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name in CONFIG_NAMES or name.endswith("_config")


def builds_config(call: ast.Call) -> bool:
    """``Config(...)``, ``config.replace(...)`` or ``dataclasses.replace(config, ...)``."""
    func = call.func
    if isinstance(func, ast.Name):
        return func.id == "Config"
    if isinstance(func, ast.Attribute) and func.attr == "replace":
        receiver = func.value if not (isinstance(func.value, ast.Name) and func.value.id == "dataclasses") \
            else (call.args[0] if call.args else func.value)
        return config_like(receiver) or (isinstance(receiver, ast.Call) and builds_config(receiver))
    return False


def exempt(tree: ast.AST) -> set[int]:
    """ids of the constant nodes that may name any knob: docstrings, and the knobs a rule involves (a rule that
    spans two owners names both, for the panel to put its message under each)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Rule" and node.args:
            found |= {id(n) for n in ast.walk(node.args[0]) if isinstance(n, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def knob_mentions(path: Path) -> list[tuple[int, str, str]]:
    """(line, knob, how) for every read, every keyword of a config being built and every string naming a knob in
    ``path``."""
    tree = ast.parse(path.read_text())
    skip = exempt(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in NAMES and config_like(node.value):
            found.append((node.lineno, node.attr, f"reads .{node.attr}"))
        elif isinstance(node, ast.Call) and builds_config(node):
            found += [(kw.value.lineno, kw.arg, f"sets {kw.arg}=") for kw in node.keywords if kw.arg in NAMES]
        elif isinstance(node, ast.Constant) and node.value in NAMES and id(node) not in skip:
            found.append((node.lineno, node.value, f"names {node.value!r}"))
    return found


def test_knobs_are_named_only_by_their_owners() -> None:
    strays = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(PACKAGE))
        if relative == "knobs/config.py":  # Config declares every knob's field, from the registry
            continue
        for line, knob, how in knob_mentions(path):
            if relative != owner_file(knob) and (relative, knob) not in ALLOWED:
                strays.append(f"{relative}:{line}: {how} outside its owner {owner_file(knob)}")
    assert not strays, "\n".join(strays)


def test_the_allow_list_holds_only_what_is_still_named() -> None:
    used = {(str(path.relative_to(PACKAGE)), knob) for path in PACKAGE.rglob("*.py")
            for _, knob, _ in knob_mentions(path)}
    assert set(ALLOWED) <= used, f"stale allow-list entries: {sorted(set(ALLOWED) - used)}"


def test_config_types_agree_with_the_registry() -> None:
    """A ``Literal`` on a Config field is what editors and type checkers see: it must list the registry's choices,
    and every knob with choices has one."""
    hints = typing.get_type_hints(Config)
    for name, knob in KNOBS.items():
        hint = hints[name]
        options = typing.get_args(hint) if typing.get_origin(hint) is not typing.Literal else (hint,)
        literal = [arg for arg in options if typing.get_origin(arg) is typing.Literal]
        if knob.choices is None:
            assert not literal, f"Config.{name} is a Literal but the knob has no choices"
            continue
        assert literal, f"Config.{name} should be a Literal of {knob.choices}"
        assert typing.get_args(literal[0]) == knob.choices, (name, typing.get_args(literal[0]), knob.choices)


def test_every_knob_has_an_entry_in_every_style() -> None:
    """One knob, one place: each owner says, for each of its knobs and each style, what to write (possibly nothing,
    or that there is no equivalent); the recipe module names no knob."""
    for owner in OWNERS:
        assert set(owner.recipe) == {knob.name for knob in owner.knobs}, owner.group
        for name, entries in owner.recipe.items():
            assert set(entries) == set(STYLES), (name, sorted(entries))
    assert sum(len(owner.recipe) for owner in OWNERS) == len(KNOBS)


#: A value off each knob's default (and what else it needs to mean something), for the test below.
CHANGED = {"batch_size": 16, "num_workers": 2, "pin_memory": True, "prefetch_factor": 4, "persistent_workers": True,
           "non_blocking": True, "data_cache": "memmap", "precision": "bf16", "tf32": True, "sdpa_backend": "math",
           "grad_accum_steps": 2, "compile_mode": "default", "sync_every": 3, "script_loss": True,
           "optimizer_impl": "fused", "set_to_none": False, "cudnn_benchmark": True, "deterministic": True,
           "channels_last": True, "memory_fraction": 0.5, "empty_cache": True, "parallel": "ddp", "world_size": 2,
           "compile_scope": "blocks", "float8": "rowwise", "activation_checkpointing": "selective",
           "expandable_segments": True, "reshard_after_forward": False}
NEEDS = {"prefetch_factor": {"num_workers": 2}, "persistent_workers": {"num_workers": 2},
         "world_size": {"parallel": "ddp"}, "compile_scope": {"compile_mode": "default"},
         "reshard_after_forward": {"parallel": "fsdp", "world_size": 2}}


def test_a_knob_set_off_its_default_is_said_in_every_style_or_said_to_have_no_equivalent() -> None:
    """No style passes over a knob the config changed in silence: each writes a line, a keyword or a flag for it, or
    says there is no equivalent and what to do instead."""
    assert set(CHANGED) == set(KNOBS), "give a new knob a changed value here"
    for name, value in CHANGED.items():
        config = Config(**NEEDS.get(name, {}), **{name: value})
        for style in STYLES:
            parts = owner_of(name).recipe[name][style](config, RecipeContext())
            assert parts and {part.knob for part in parts} == {name}, (name, style, parts)
