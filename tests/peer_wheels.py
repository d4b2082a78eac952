"""The vLLM and SGLang wheels the managed-server flag tables were read from (pinned here), and what each
declares, read from the wheel's own source with `ast`, never imported (neither runs on these CPUs): the
flags its command-line parser takes, the values it accepts where it has a fixed list.

    python tests/peer_wheels.py      # pip download --no-deps each pinned wheel into wheel_dir() (.ci/run)

vLLM registers most flags as `group.add_argument("--flag", **kwargs["field"])` (vllm/engine/arg_utils.py)
and its frontend's from dataclass fields (`--` + the field name with `-`, entrypoints/common/cli_args.py);
a field typed bool gets argparse.BooleanOptionalAction (`--no-x`), which its parser swaps for
EnableDisableAction (`--disable-x` for `--enable-x`) where it registers that. SGLang declares them as
annotated fields, `name: A[T, "help"]` or `A[T, Arg(cli_name=, aliases=, choices=, no_cli=)]`, under
sglang/srt/arg_groups/fields/ (the flag: `--` + the field name with `-`), plus a few `add_argument` calls in
sglang/srt/server_args.py.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

WHEELS = {"vllm": "0.33.0", "sglang": "0.5.23"}  # the releases the tables name (app/managed/*.py)


def wheel_dir() -> Path:
    """INFERLAB_PEER_WHEELS, else the user cache's inferlab/peer-wheels (where .ci/run downloads them)."""
    override = os.environ.get("INFERLAB_PEER_WHEELS")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(override) if override else cache / "inferlab" / "peer-wheels"


def find_wheel(name: str) -> Path | None:
    found = sorted(wheel_dir().glob(f"{name}-{WHEELS[name]}-*.whl"))
    return found[0] if found else None


def download() -> None:
    """Each pinned wheel not yet in wheel_dir(), by pip (no dependencies): CalledProcessError when pip fails."""
    for name, version in WHEELS.items():
        if find_wheel(name) is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"{name}=={version}",
                            "-d", str(wheel_dir())], check=True)
        print(f"{name} {version}: {find_wheel(name)}")


@dataclass
class Declared:
    """What a wheel's parser takes: its version, every flag spelling, the accepted values of flags with a
    fixed list, and other names the tables rely on (a subcommand, a module, method names)."""
    version: str
    flags: set[str] = field(default_factory=set)
    choices: dict[str, tuple[str, ...]] = field(default_factory=dict)
    names: dict[str, tuple[str, ...]] = field(default_factory=dict)


class _Wheel:
    def __init__(self, path: Path) -> None:
        self.zip = zipfile.ZipFile(path)
        self.members = set(self.zip.namelist())

    def tree(self, member: str) -> ast.Module:
        return ast.parse(self.zip.read(member).decode("utf-8"), filename=member)

    def version(self) -> str:
        meta = next(m for m in self.members if m.endswith(".dist-info/METADATA"))
        line = next(li for li in self.zip.read(meta).decode("utf-8").splitlines() if li.startswith("Version:"))
        return line.split(":", 1)[1].strip()


def _strings(node: ast.AST, scope: dict[str, ast.AST]) -> tuple[str, ...]:
    """The string constants of a list, tuple or Literal[...], names resolved in `scope` (nested Literals)."""
    if isinstance(node, ast.Subscript):  # Literal[...]
        return _strings(node.slice, scope)
    if isinstance(node, (ast.List, ast.Tuple)):
        return tuple(s for elt in node.elts for s in _strings(elt, scope))
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return (node.value,)
    if isinstance(node, ast.Name) and node.id in scope:
        return _strings(scope[node.id], scope)
    return ()


def _assignments(tree: ast.Module) -> dict[str, ast.AST]:
    """Module-level `NAME = value` (and annotated ones) by name."""
    out: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            out.update({t.id: node.value for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node.value
    return out


def _add_argument_flags(tree: ast.Module) -> dict[str, ast.Call]:
    """Every literal flag of an `….add_argument(...)` call, with its call."""
    return {arg.value: node for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
            for arg in node.args if isinstance(arg, ast.Constant) and str(arg.value).startswith("-")}


def _kwargs_field(call: ast.Call) -> str | None:
    """The dataclass field an add_argument call takes its keyword arguments from (`**kw["field"]`)."""
    for node in ast.walk(call):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and \
                isinstance(node.value, ast.Name) and node.value.id.endswith("kwargs"):
            return node.slice.value
    return None


def _field_types(trees: list[ast.Module]) -> dict[str, str]:
    """Annotated class fields (`name: type`) of the given modules: name -> the annotation's source."""
    return {node.target.id: ast.unparse(node.annotation) for tree in trees for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef) for node in node.body
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}


def vllm_declared(path: Path) -> Declared:
    w = _Wheel(path)
    declared = Declared(w.version())
    args = w.tree("vllm/engine/arg_utils.py")
    calls = _add_argument_flags(args)
    declared.flags |= set(calls)
    front = w.tree("vllm/entrypoints/common/cli_args.py")
    for cls in ast.walk(front):
        if isinstance(cls, ast.ClassDef) and cls.name in ("FrontendArgs", "BaseFrontendArgs"):
            declared.flags |= {"--" + n.target.id.replace("_", "-") for n in cls.body
                               if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    configs = [w.tree(f"vllm/config/{m}.py") for m in ("cache", "scheduler", "model", "speculative")]
    types = _field_types([args, *configs])
    parser_utils = ast.unparse(w.tree("vllm/utils/argparse_utils.py"))
    enable_disable = "self.register('action', BooleanOptionalAction, EnableDisableAction)" in parser_utils
    for flag, call in calls.items():
        explicit = any(k.arg == "action" and "BooleanOptionalAction" in ast.unparse(k.value) for k in call.keywords)
        name = _kwargs_field(call)
        if explicit or (name and "bool" in types.get(name, "").split(" | ")):  # argparse's --no-x
            declared.flags.add("--no-" + flag.removeprefix("--"))
            if enable_disable and flag.startswith("--enable-"):
                declared.flags.add("--disable-" + flag.removeprefix("--enable-"))
    cache, quant = w.tree("vllm/config/cache.py"), w.tree("vllm/model_executor/layers/quantization/__init__.py")
    declared.choices["--kv-cache-dtype"] = _strings(_assignments(cache)["CacheDType"], _assignments(cache))
    declared.choices["--quantization"] = _strings(_assignments(quant)["QuantizationMethods"], _assignments(quant))
    spec = _assignments(configs[3])
    declared.names["speculative methods"] = _strings(spec["SpeculativeMethod"], spec)
    serve = w.tree("vllm/entrypoints/cli/serve.py")
    declared.names["subcommands"] = tuple(
        n.value.value for c in ast.walk(serve) if isinstance(c, ast.ClassDef) for n in c.body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "name" for t in n.targets)
        and isinstance(n.value, ast.Constant))
    return declared


def sglang_declared(path: Path) -> Declared:
    w = _Wheel(path)
    declared = Declared(w.version())
    scope = _assignments(w.tree("sglang/srt/arg_groups/choices.py"))
    fields_dir = "sglang/srt/arg_groups/fields/"
    for member in sorted(m for m in w.members if m.startswith(fields_dir) and m.endswith(".py")):
        tree = w.tree(member)
        module_scope = {**scope, **_assignments(tree)}
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in cls.body:
                flags, choices = _sglang_field(node, module_scope)
                declared.flags |= set(flags)
                if choices:
                    declared.choices.update({f: choices for f in flags})
    declared.flags |= set(_add_argument_flags(w.tree("sglang/srt/server_args.py")))
    declared.names["modules"] = tuple(m.removesuffix(".py").replace("/", ".") for m in w.members
                                      if m.count("/") == 1 and m.startswith("sglang/") and m.endswith(".py"))
    spec = w.tree("sglang/srt/speculative/spec_info.py")
    declared.names["speculative algorithms"] = tuple(
        t.id for c in ast.walk(spec) if isinstance(c, ast.ClassDef) and c.name == "SpeculativeAlgorithm"
        for n in c.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name))
    return declared


def _sglang_field(node: ast.AST, scope: dict[str, ast.AST]) -> tuple[list[str], tuple[str, ...]]:
    """(the flags, the choices) of one `name: A[T, meta]` field; ([], ()) for one that is no flag."""
    if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            and isinstance(node.annotation, ast.Subscript) and getattr(node.annotation.value, "id", "") == "A"
            and isinstance(node.annotation.slice, ast.Tuple) and len(node.annotation.slice.elts) >= 2):
        return [], ()
    meta = node.annotation.slice.elts[1]
    keywords = ({k.arg: k.value for k in meta.keywords}
                if isinstance(meta, ast.Call) and getattr(meta.func, "id", "") == "Arg" else {})
    if isinstance(keywords.get("no_cli"), ast.Constant) and keywords["no_cli"].value is True:
        return [], ()
    name = keywords.get("cli_name")
    flags = [name.value if isinstance(name, ast.Constant) else "--" + node.target.id.replace("_", "-")]
    flags += list(_strings(keywords["aliases"], scope)) if "aliases" in keywords else []
    return flags, _strings(keywords["choices"], scope) if "choices" in keywords else ()


if __name__ == "__main__":
    download()
