"""Every error message dsx can print, read from the source (docs/troubleshooting.md is generated from it).

A message is the first argument of a `raise SomethingError(...)` in ds_export/, with each
`{...}` placeholder of an f-string shown as `…`; its hint (the `hint=` text, what to do) and
the exception class (what kind of problem, and the exit code) come with it.

    python -m ds_export.cli.error_catalog > docs/troubleshooting.md
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]

KINDS = {
    "UsageError": ("2", "a command-line option, recipe or argument is wrong"),
    "CheckpointError": ("1", "a checkpoint or output on disk is malformed, incomplete or inconsistent"),
    "ModelMapError": ("1", "a tensor or config does not fit DeepSeek-V3's architecture"),
    "DownloadError": ("1", "the hub or the transfer failed, or a file did not verify"),
    "Interrupted": ("130", "interrupted (Ctrl-C; 143 for SIGTERM, handled the same way); rerun the same command "
                           "to resume"),
    "DsxError": ("1", "the operation failed; the message names the file, tensor or step"),
}


@dataclass(frozen=True)
class Message:
    text: str
    kind: str
    hint: str
    where: str  # module path relative to ds_export/


def _render(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            parts.append(v.value if isinstance(v, ast.Constant) else "…")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _render(node.left), _render(node.right)
        return (a or "…") + (b or "…")
    return None


def _as_parts(node: ast.AST) -> list:
    if isinstance(node, ast.JoinedStr):
        return list(node.values)
    if isinstance(node, ast.Constant):
        return [node]
    return [ast.FormattedValue(node, -1, None)]


def _name(func: ast.AST) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _hint(call: ast.Call) -> str:
    return next((_render(k.value) or "" for k in call.keywords if k.arg == "hint"), "")


def _factories(tree: ast.AST) -> dict[str, tuple[str, str]]:
    """Module functions that build an error, e.g. `def _bad(path, what): return CheckpointError(...)`."""
    out = {}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Return) and isinstance(node.value, ast.Call) and _name(node.value.func) in KINDS:
                    out[fn.name] = (_name(node.value.func), _hint(node.value))
    return out


def collect(root: Path = PACKAGE) -> list[Message]:
    out: dict[tuple[str, str], Message] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        factories = _factories(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            kind = _name(node.exc.func)
            args, hint = node.exc.args, _hint(node.exc)
            if kind in factories and args:  # `raise _bad(path, "what")`: the location, then the text
                (kind, hint), args = factories[kind], [ast.JoinedStr([ast.Constant("…: "), *_as_parts(args[-1])])]
            if kind not in KINDS or not args:
                continue
            text = _render(args[0])
            if not text or not text.strip("… "):
                continue
            m = Message(" ".join(text.split()), kind, " ".join(hint.split()), str(path.relative_to(root)))
            out.setdefault((m.text, m.where), m)
    return sorted(out.values(), key=lambda m: (m.where, m.text))


def _cell(s: str) -> str:
    return s.replace("|", "\\|") or "-"


def render(messages: list[Message]) -> str:
    lines = [
        "# Troubleshooting: every error message",
        "",
        "dsx prints one line on stderr, `dsx: error: MESSAGE (WHAT TO DO)`, and exits with the code below",
        "(`DSX_DEBUG=1` adds the traceback). `…` stands for the file, tensor, value or count the message",
        "names. This page is generated from the source (`python -m ds_export.cli.error_catalog`), and a test",
        "fails when the two disagree.",
        "",
        "| kind | exit | meaning |",
        "|---|---|---|",
    ]
    lines += [f"| {k} | {code} | {meaning} |" for k, (code, meaning) in KINDS.items()]
    current = None
    for m in messages:
        if m.where != current:
            current = m.where
            lines += ["", f"## `ds_export/{current}`", "", "| message | kind | what to do |", "|---|---|---|"]
        lines.append(f"| {_cell(m.text)} | {m.kind} | {_cell(m.hint)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(collect()), end="")
