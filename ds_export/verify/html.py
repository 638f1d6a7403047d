"""`dsx verify --html`: one self-contained page (inline SVG, no scripts, no network) of a verify report.

Sections: verdict and findings; per-layer SQNR by role (one series per format and role, the gate
as a dashed line); the SQNR distribution per format; the kernel checks; the summary table.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict

W, H, PAD = 760, 300, 46
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
          "#bcbd22"]


def _esc(s) -> str:
    return html.escape(str(s))


def _axes(x0, x1, y0, y1, xlabel, ylabel, xticks=None) -> list[str]:
    out = [f'<rect x="{PAD}" y="10" width="{W - PAD - 10}" height="{H - PAD - 10}" fill="none" stroke="#999"/>',
           f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle" font-size="12">{_esc(xlabel)}</text>',
           f'<text x="12" y="{H / 2}" transform="rotate(-90 12 {H / 2})" text-anchor="middle" font-size="12">'
           f'{_esc(ylabel)}</text>']
    for i in range(5):
        v = y0 + (y1 - y0) * i / 4
        y = _sy(v, y0, y1)
        out.append(f'<text x="{PAD - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10">{v:.0f}</text>')
        out.append(f'<line x1="{PAD}" x2="{W - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
    for v in xticks if xticks is not None else [x0 + (x1 - x0) * i / 5 for i in range(6)]:
        out.append(f'<text x="{_sx(v, x0, x1):.1f}" y="{H - PAD + 14}" text-anchor="middle" font-size="10">'
                   f'{v:.0f}</text>')
    return out


def _sx(v, x0, x1) -> float:
    return PAD + (v - x0) / ((x1 - x0) or 1) * (W - PAD - 10)


def _sy(v, y0, y1) -> float:
    return H - PAD - (v - y0) / ((y1 - y0) or 1) * (H - PAD - 10)


def _per_layer(weights: list[dict]) -> str:
    series: dict[str, list] = defaultdict(list)
    gates = {}
    for w in weights:
        if w["sqnr_db"] is None or w["layer"] is None or not math.isfinite(w["sqnr_db"]):
            continue
        key = f"{w['format']} {'mtp:' if w['mtp'] else ''}{w['role']}"
        series[key].append((w["layer"], w["sqnr_db"]))
        gates[w["format"]] = w["gate"]
    if not weights:
        return "<p>No weights were compared (integrity failed first, or no --reference was given).</p>"
    if not series:
        return "<p>Every compared tensor is bit-identical to the reference (copies): no SQNR to plot.</p>"
    xs = [x for s in series.values() for x, _ in s]
    ys = [y for s in series.values() for _, y in s] + [g for g in gates.values() if math.isfinite(g)]
    lo, hi = min(xs), max(xs)
    step = max(1, math.ceil((hi - lo + 1) / 12))
    x0, x1, y0, y1 = lo - 0.5, hi + 0.5 + 0.25 * (hi - lo + 1), math.floor(min(ys) - 2), math.ceil(max(ys) + 2)
    out = _axes(x0, x1, y0, y1, "layer", "SQNR (dB)", xticks=list(range(lo, hi + 1, step)))
    for i, (key, pts) in enumerate(sorted(series.items())):
        c = COLORS[i % len(COLORS)]
        for x, y in pts:
            out.append(f'<circle cx="{_sx(x, x0, x1):.1f}" cy="{_sy(y, y0, y1):.1f}" r="3" fill="{c}">'
                       f'<title>{_esc(key)} layer {x}: {y:.1f} dB</title></circle>')
        out.append(f'<text x="{W - 14}" y="{24 + 14 * i}" text-anchor="end" font-size="11" fill="{c}">{_esc(key)}</text>')
    for fmt, g in gates.items():
        if math.isfinite(g):
            y = _sy(g, y0, y1)
            out.append(f'<line x1="{PAD}" x2="{W - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d62728" '
                       f'stroke-dasharray="5,4"><title>{_esc(fmt)} gate {g} dB</title></line>')
    return f'<svg width="{W}" height="{H}" xmlns="http://www.w3.org/2000/svg">{"".join(out)}</svg>'


def _histogram(weights: list[dict]) -> str:
    by_fmt: dict[str, list] = defaultdict(list)
    for w in weights:
        if w["sqnr_db"] is not None and math.isfinite(w["sqnr_db"]):
            by_fmt[w["format"]].append(w["sqnr_db"])
    if not by_fmt:
        return ""
    allv = [v for vs in by_fmt.values() for v in vs]
    lo, hi, nb = math.floor(min(allv)), math.ceil(max(allv)) + 1, 30
    width = (hi - lo) / nb
    counts = {f: [0] * nb for f in by_fmt}
    for f, vs in by_fmt.items():
        for v in vs:
            counts[f][min(nb - 1, int((v - lo) / width))] += 1
    top = max(max(c) for c in counts.values())
    out = _axes(lo, hi, 0, top, "SQNR (dB)", "tensors")
    bw = (W - PAD - 10) / nb / max(1, len(counts))
    for i, (f, cs) in enumerate(sorted(counts.items())):
        c = COLORS[i % len(COLORS)]
        for b, n in enumerate(cs):
            if n:
                x = _sx(lo + b * width, lo, hi) + i * bw
                y = _sy(n, 0, top)
                out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw:.1f}" height="{H - PAD - y:.1f}" fill="{c}">'
                           f'<title>{_esc(f)}: {n} tensors at {lo + b * width:.1f} dB</title></rect>')
        out.append(f'<text x="{W - 14}" y="{24 + 14 * i}" text-anchor="end" font-size="11" fill="{c}">{_esc(f)}</text>')
    return f'<svg width="{W}" height="{H}" xmlns="http://www.w3.org/2000/svg">{"".join(out)}</svg>'


def _table(head: list[str], rows: list[list]) -> str:
    th = "".join(f"<th>{_esc(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


def render(rep: dict) -> str:
    ok = rep["ok"]
    checked = rep.get("checked") or []
    verdict = (f"<p class='ok'>All checks passed ({_esc(', '.join(checked))})."
               + ("" if "weights" in checked or not checked else
                  " Integrity only: the weights, kernels and logits need --reference.") + "</p>" if ok else
               f"<p class='bad'>FAILED: {len(rep['findings'])} integrity findings, "
               f"{sum(not w['ok'] for w in rep['weights'])} weights and "
               f"{sum(not k['ok'] for k in rep.get('kernels', []))} kernel checks out of range.</p>")
    findings = _table(["check", "where", "problem"], [[f["check"], f["where"], f["problem"]] for f in rep["findings"]]) \
        if rep["findings"] else "<p>No integrity findings: every file, hash, tensor and config key agrees.</p>"
    summary = _table(["format", "role", "tensors", "bit-identical", "min SQNR dB", "gate dB", "min cosine",
                      "bytes as dsx converts the source", "failed"],
                     [[g["format"], g["role"], g["tensors"], g["exact"],
                       "-" if g["min_sqnr_db"] is None else f"{g['min_sqnr_db']:.1f}",
                       "exact" if g["gate_db"] == float("inf") else g["gate_db"],
                       "-" if g["min_cosine"] is None else f"{g['min_cosine']:.5f}",
                       f"{g['differ']} differ" if g.get("differ") else g.get("reproduced") or "-", g["failed"]]
                      for g in rep["by_format"].values()])
    kernels = _table(["kernel", "tensor", "error vs float64 on its inputs", "quantization SQNR dB", "ok"],
                     [[k["kernel"], k["tensor"], f"{k['kernel_err']:.2e}",
                       "-" if k["quant_sqnr_db"] is None else f"{k['quant_sqnr_db']:.1f}", k["ok"]]
                      for k in rep.get("kernels", [])])
    bad = [w for w in rep["weights"] if not w["ok"]]
    failed = ("<h2>Weights that failed</h2>" + _table(
        ["tensor", "format", "SQNR dB", "gate dB", "max abs error", "problem"],
        [[w["name"], w["format"], "-" if w["sqnr_db"] is None else f"{w['sqnr_db']:.1f}",
          "exact" if w["gate"] == float("inf") else w["gate"], w["max_abs"],
          w.get("problem") or ("not bit-identical to the source" if w["gate"] == float("inf") else "below the gate")]
         for w in bad])) if bad else ""
    style = ("body{font-family:sans-serif;max-width:980px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px}"
             ".ok{color:#2ca02c;font-weight:bold}.bad{color:#d62728;font-weight:bold}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>dsx verify: {_esc(rep['target'])}</title>"
            f"<style>{style}</style></head><body><h1>dsx verify</h1>"
            f"<p>target <code>{_esc(rep['target'])}</code>, reference <code>{_esc(rep['reference'])}</code></p>"
            f"{verdict}<h2>Integrity</h2>{findings}{failed}"
            f"<h2>Weight SQNR per layer and role</h2>{_per_layer(rep['weights'])}"
            f"<h2>SQNR distribution per format</h2>{_histogram(rep['weights'])}"
            f"<h2>Kernels</h2>{kernels}<h2>Summary</h2>{summary}</body></html>\n")
