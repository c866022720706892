"""A default is written once, in config/config.schema.yaml, and reaches code through one typed job.

Two checks: every section dataclass has exactly its schema section's properties, none with a
default of its own (so the two cannot drift), and no source file restates a schema default
(``.get("<schema key>", <value>)``, ``.get("<schema key>") or <value>``, a parameter or field
named like a section key with a literal default, a dict literal of a section's keys and values).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from energysweep.job.sections import SECTIONS, Emulated, ModelEntry
from energysweep.validity.verdict import Thresholds

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = yaml.safe_load((ROOT / "config" / "config.schema.yaml").read_text())
# Sources a restated default could hide in: the package and the Snakemake scripts (Python), and
# the rules (Snakemake's own syntax: searched as text).
SOURCES = [*sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "scripts").glob("*.py"))]
RULES = [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))]
TYPED = {**SECTIONS, "validity": Thresholds}


def _defaulted(node: dict, out: set[str]) -> set[str]:
    """Every property name in the schema that has a default (at any depth)."""
    for name, sub in (node.get("properties") or {}).items():
        if "default" in sub:
            out.add(name)
        _defaulted(sub, out)
    if isinstance(node.get("items"), dict):
        _defaulted(node["items"], out)
    return out


# Keys whose default the schema writes: a second value for one of these is a second copy.
SCHEMA_KEYS = _defaulted(SCHEMA, set())
# Keys of the sections a job or the verdict carries: a parameter named like one of these with a
# literal default is a second copy of the schema's default.
SECTION_KEYS = {k for name in TYPED for k in SCHEMA["properties"][name]["properties"]} | {
    "dtype",
    "seed",
    "gpus_per_node",
}


@pytest.mark.parametrize("name", sorted(TYPED))
def test_section_dataclass_fields_are_the_schema_section_properties(name):
    cls = TYPED[name]
    fields = dataclasses.fields(cls)
    assert [f.name for f in fields] == list(SCHEMA["properties"][name]["properties"])
    with_default = [
        f.name
        for f in fields
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    ]
    assert with_default == [], f"{cls.__name__} restates schema defaults: {with_default}"


def test_emulated_section_fields_are_the_schema_properties():
    """measurement.emulated, a section inside a section: the same rule, one level down."""
    props = SCHEMA["properties"]["measurement"]["properties"]["emulated"]["properties"]
    fields = dataclasses.fields(Emulated)
    assert [f.name for f in fields] == list(props)
    assert all(
        f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        for f in fields
    )


def test_model_entry_fields_are_the_schema_model_properties():
    props = SCHEMA["properties"]["models"]["items"]["properties"]
    assert [f.name for f in dataclasses.fields(ModelEntry)] == list(props)


def _literal(node: ast.AST) -> bool:
    """A value written out in the source (a constant other than None, a list/dict/set of them)."""
    if isinstance(node, ast.Constant):
        return node.value is not None
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return True
    if isinstance(node, ast.Dict):
        return True
    if isinstance(node, ast.UnaryOp):  # -1
        return _literal(node.operand)
    return False


def _get_key(node: ast.AST) -> str | None:
    """``"k"`` of a ``<x>.get("k", ...)`` call whose key is a schema key."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value in SCHEMA_KEYS
    ):
        return node.args[0].value
    return None


def restated_defaults(tree: ast.AST) -> list[str]:
    """Every place in ``tree`` that writes a schema key's value out instead of reading it."""
    found = []
    for node in ast.walk(tree):
        key = _get_key(node)
        if key and len(node.args) > 1 and _literal(node.args[1]):
            found.append(f"line {node.lineno}: .get({key!r}, <default>)")
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            key = _get_key(node.values[0])
            if key and any(_literal(v) or isinstance(v, ast.Name) for v in node.values[1:]):
                found.append(f"line {node.lineno}: .get({key!r}) or <default>")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            defaulted = positional[len(positional) - len(args.defaults) :]
            pairs = list(zip(defaulted, args.defaults, strict=True))
            pairs += [
                (a, d)
                for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                if d is not None
            ]
            found += [
                f"line {node.lineno}: parameter {a.arg}=<default>"
                for a, d in pairs
                if a.arg in SECTION_KEYS and _literal(d)
            ]
        if isinstance(node, ast.ClassDef):  # a dataclass field with a default of its own
            found += [
                f"line {f.lineno}: field {f.target.id} = <default>"
                for f in node.body
                if isinstance(f, ast.AnnAssign)
                and isinstance(f.target, ast.Name)
                and f.target.id in SECTION_KEYS
                and f.value is not None
                and _literal(f.value)
            ]
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            for section in TYPED:
                props = SCHEMA["properties"][section]["properties"]
                if len(keys) >= 2 and all(k in props for k in keys):
                    found.append(f"line {node.lineno}: a dict of {section} keys {keys}")
    return sorted(found, key=lambda f: int(f.split(":")[0].split()[1]))


def test_the_checker_sees_each_kind_of_restated_default():
    source = """
cfg.get("sampler_hz", 10)
limits.get("collective_timeout_s") or DEFAULT
def f(idle_baseline_s=5): ...
class C:
    cooldown_s: float = 2
D = {"job_timeout_s": 1, "kill_grace_s": 2}
cfg.get("sampler_hz")
cfg["sampler_hz"]
def g(idle_baseline_s): ...
"""
    found = restated_defaults(ast.parse(source))
    assert [f.split(":")[0] for f in found] == [f"line {n}" for n in (2, 3, 4, 6, 7)], found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_schema_default_is_restated(path):
    found = restated_defaults(ast.parse(path.read_text(), str(path)))
    assert not found, (
        f"{path.relative_to(ROOT)} restates schema defaults (config/config.schema.yaml holds "
        f"them; read the validated config or the typed job): {found}"
    )


# ``.get("key", <anything but None>`` and ``.get("key") or`` in the rules' text.
_RULE_GET = re.compile(r"""\.get\(\s*["'](\w+)["']\s*(?:,\s*(?!None\b)[^)\s]|\)\s*or\b)""")


def rule_defaults(text: str) -> list[str]:
    """Every restated default in a Snakemake file's text (a schema key with a fallback)."""
    return [
        f"line {text.count(chr(10), 0, m.start()) + 1}: .get({m.group(1)!r}, ...)"
        for m in _RULE_GET.finditer(text)
        if m.group(1) in SCHEMA_KEYS
    ]


def test_the_rule_checker_sees_a_fallback():
    text = 'a = config["x"].get("sampler_hz", 10)\nb = c.get("spec", {})\nd = c.get("seed") or 0\n'
    assert rule_defaults(text) == ["line 1: .get('sampler_hz', ...)", "line 3: .get('seed', ...)"]
    assert rule_defaults('c.get("sampler_hz")\nc.get("sampler_hz", None)') == []


@pytest.mark.parametrize("path", RULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_rule_restates_a_schema_default(path):
    found = rule_defaults(path.read_text())
    assert not found, f"{path.relative_to(ROOT)} restates schema defaults: {found}"
