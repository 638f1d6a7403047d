"""The CLI's output: lines printed while a progress bar is drawn, and the bars dsx run gives its steps."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from ds_export.cli.output import Out
from ds_export.cli.progress import DownloadBar, ExportBar, ProgressBar, QuantizeBar, VerifyBar

SGR = re.compile(r"\x1b\[[0-9;]*m")  # colours and styles, which do not move the cursor


def _out(stdout: io.StringIO, stderr: io.StringIO, out_terminal: bool, err_terminal: bool, **kw) -> Out:
    o = Out(**kw)
    o.console = Console(file=stdout, force_terminal=out_terminal, width=100, highlight=False, soft_wrap=True)
    o.err = Console(file=stderr, force_terminal=err_terminal, width=100, highlight=False, soft_wrap=True)
    return o


def _print_under_bar(o: Out) -> None:
    with VerifyBar(o) as bar:
        advance = bar.phase("weights (3 tensors)", 3 << 20)
        advance(1 << 20)
        bar.p.refresh()  # (drawn at least once before the line, as a bar of a long step is)
        o.print("  all checks passed: 3 weights")
        advance(2 << 20)
    o.print("after the bar")


def test_a_line_printed_under_a_bar_lands_on_its_own_line():
    """On a terminal, stdout and the bar's stderr are one screen: a step's closing line printed while its bar is drawn
    must start a line of its own (it landed at the end of the bar's line: a Console's writes pass rich's stdout
    redirection by)."""
    screen = io.StringIO()  # both streams to one terminal, as a user sees them
    o = _out(screen, screen, True, True)
    _print_under_bar(o)
    raw = screen.getvalue()
    before = SGR.sub("", raw[: raw.index("  all checks passed")])
    # the bar's lines are erased (cursor to column 0 and the line cleared) before the line is written
    assert before.endswith(("\x1b[2K", "\n", "\r")), repr(before[-60:])
    assert "after the bar" in raw and o.live is None


@pytest.mark.parametrize("out_terminal,err_terminal", [(False, True), (True, False), (False, False)])
def test_lines_stay_on_stdout_unless_both_streams_are_terminals(out_terminal, err_terminal):
    """stdout to a file or pipe (dsx run > log), or stderr away from the terminal: every line on stdout, none moved
    to stderr (a log would lose them)."""
    out, err = io.StringIO(), io.StringIO()
    _print_under_bar(_out(out, err, out_terminal, err_terminal))
    assert "all checks passed" in out.getvalue() and "after the bar" in out.getvalue()
    assert "all checks passed" not in err.getvalue()


def test_both_terminals_route_the_line_through_the_bar_then_back():
    out, err = io.StringIO(), io.StringIO()
    o = _out(out, err, True, True)
    _print_under_bar(o)
    assert "all checks passed" in err.getvalue() and "all checks passed" not in out.getvalue()
    assert "after the bar" in out.getvalue()  # (the bar closed: stdout again)


@pytest.mark.parametrize("kw", [{"json": True}, {"quiet": True}])
def test_quiet_and_json_print_nothing_and_draw_nothing(kw):
    out, err = io.StringIO(), io.StringIO()
    _print_under_bar(_out(out, err, True, True, **kw))
    assert out.getvalue() == "" and err.getvalue() == ""


def test_nested_bars_restore_the_outer_one():
    out, err = io.StringIO(), io.StringIO()
    o = _out(out, err, True, True)
    with QuantizeBar(o) as outer:
        with DownloadBar(o):
            assert o.live is not None
        assert o.live is outer.p.console
    assert o.live is None


def test_run_draws_the_commands_own_bars():
    """dsx run's steps get the bars dsx download, quantize, export and verify draw, and no bar for the others."""
    from ds_export.cli.cmd_run import _reporters

    progress = _reporters(Out())
    assert type(progress("download")) is DownloadBar and type(progress("quantize")) is QuantizeBar
    assert type(progress("verify")) is VerifyBar
    assert type(progress("export")) is ExportBar and progress("generate") is None
    assert all(issubclass(c, ProgressBar) for c in (DownloadBar, QuantizeBar, ExportBar, VerifyBar))


def _clocked(bar: ProgressBar, now: list[float]) -> ProgressBar:
    bar._clock = lambda: now[0]  # (the bar's and rich's clock: its rate and time left too)
    bar._since = now[0]
    return bar


def test_a_log_gets_a_line_a_minute_instead_of_a_bar():
    """stderr not a terminal (nohup, a batch job's output file, a pipe): no bar is drawn (rich wrote one garbled bar at
    the end, after hours of nothing), but the bar's state as one plain line at most every LOG_EVERY_S seconds: what,
    how far, the rate over the last seconds and the time left."""
    from ds_export.cli import progress

    out, err = io.StringIO(), io.StringIO()
    o, now = _out(out, err, False, False), [0.0]
    with _clocked(QuantizeBar(o), now) as bar:
        bar.start(10 << 30, 5, 1)
        bar.tensor("model.layers.3.mlp.experts.7.up_proj.weight")
        for _ in range(10):  # 1 GiB every 20 s: a line at 60, 120, 180 s
            now[0] += 20
            bar.advance(1 << 30)
    lines = err.getvalue().splitlines()
    assert len(lines) == 3 and progress.LOG_EVERY_S == 60, lines
    assert lines[0] == ("quantize model.layers.3.mlp.experts.7.up_proj.weight: 3.00 GiB of 10.00 GiB (30%), "
                        "51.20 MiB/s, 2 min 20 s left")
    assert lines[2].endswith("9.00 GiB of 10.00 GiB (90%), 51.20 MiB/s, 20 s left")
    assert "━" not in err.getvalue() and out.getvalue() == ""


def test_a_log_of_a_short_job_gets_no_line_and_every_bar_logs():
    """A job shorter than a minute writes no progress line to a log (the demo's output stays its steps); download
    and verify's phases log as quantize does (verify's checks counted, not bytes); --json and --quiet nothing."""
    out, err = io.StringIO(), io.StringIO()
    o, now = _out(out, err, False, False), [0.0]
    with _clocked(DownloadBar(o), now) as bar:
        bar.start(4 << 30, 0, 3, 0)
        now[0] += 59
        bar.advance(1 << 30)
        assert err.getvalue() == ""
        now[0] += 1
        bar.advance(1 << 30)
    assert err.getvalue().startswith("download 0/3 files: 2.00 GiB of 4.00 GiB (50%)")
    err.truncate(0), err.seek(0)
    with _clocked(VerifyBar(o), now) as bar:
        checks = bar.phase("kernels (cpu)", 45, "checks")
        now[0] += 61
        checks(9)
    assert err.getvalue().startswith("kernels (cpu): 9 of 45 checks (20%)"), err.getvalue()
    for kw in ({"json": True}, {"quiet": True}):
        quiet = io.StringIO()
        with _clocked(QuantizeBar(_out(io.StringIO(), quiet, False, False, **kw)), now) as bar:
            bar.start(1 << 30, 1, 0)
            now[0] += 120
            bar.advance(1 << 29)
        assert quiet.getvalue() == ""


def test_a_phase_without_a_total_shows_what_is_done():
    """dsx export's parameters written (their total is known only once every program is built): the bar and a log's
    line show the bytes so far and the rate, no share and no time left."""
    shown, log = io.StringIO(), io.StringIO()
    now = [0.0]
    with ExportBar(_out(io.StringIO(), shown, False, True)) as bar:
        bar.phase("parameters written", None)(3 << 20)
        bar.p.refresh()
    assert "parameters written" in shown.getvalue() and "3.00 MiB" in shown.getvalue()
    assert "3.00 MiB/" not in shown.getvalue()
    with _clocked(ExportBar(_out(io.StringIO(), log, False, False)), now) as bar:
        written, built = bar.phase("parameters written", None), bar.phase("programs (2 ranks)", 2, "programs")
        for _ in range(3):
            now[0] += 30
            written(60 << 20)
        built(1)
        now[0] += 60
        built(1)
    # (each phase its own line a minute: the programs' first count, at 90 s, is a minute past the start)
    assert log.getvalue().splitlines() == ["parameters written: 120.00 MiB, 2.00 MiB/s",
                                           "programs (2 ranks): 1 of 2 programs (50%)",
                                           "programs (2 ranks): 2 of 2 programs (100%)"]
