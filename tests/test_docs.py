"""The docs match what the CLI does: docs/troubleshooting.md lists exactly the error messages in the code,
and errors the CLI really prints are found there."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ds_export.cli.error_catalog import collect, render

DOC = Path(__file__).parents[1] / "docs" / "troubleshooting.md"


def _doc_messages() -> set[str]:
    rows = [ln for ln in DOC.read_text().splitlines() if ln.startswith("| ") and not ln.startswith(("| kind", "| message"))]
    return {ln[2:].split(" | ")[0].replace("\\|", "|") for ln in rows if " | " in ln} - {
        k for k in ("UsageError", "CheckpointError", "ModelMapError", "DownloadError",
                    "Interrupted", "DsxError")}


def test_every_message_in_the_doc_is_in_the_code_and_vice_versa():
    code = {m.text for m in collect()}
    doc = _doc_messages()
    assert code - doc == set(), "in the code but not in docs/troubleshooting.md (regenerate it)"
    assert doc - code == set(), "in docs/troubleshooting.md but no longer in the code (regenerate it)"
    assert DOC.read_text() == render(collect()), "docs/troubleshooting.md is stale: python -m ds_export.cli.error_catalog"
    assert len(code) > 150


def _matches(line: str, templates: set[str]) -> bool:
    for t in templates:
        rx = ".*".join(re.escape(p) for p in t.split("…"))
        if re.fullmatch(rx + r"( \(.*\))?", line):
            return True
    return False


@pytest.mark.parametrize("args", [
    ["inspect", "/does/not/exist"],
    ["quantize", "/does/not/exist", "--out", "/tmp/x", "--type", "int3"],
    ["quantize", ".", "--out", "/tmp/x", "--type", "bf16", "--mtp-only", "--no-mtp"],
    ["generate", ".", "--input-ids", "1,x"],
    ["run", "recipes/r1-wint4-tp8.yaml", "--dry-run", "--metadata", "/does/not/exist", "--workdir",
     "/tmp/dsx-no-such-workdir"],
])
def test_printed_errors_are_documented(args, tiny_fp8):
    r = subprocess.run([sys.executable, "-m", "ds_export.cli.app", *args], capture_output=True, text=True)
    assert r.returncode in (1, 2)
    line = r.stderr.strip().removeprefix("dsx: error: ")
    assert _matches(line, _doc_messages()), line
