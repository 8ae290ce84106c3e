"""Progress: plain lines without a terminal (one per tenth and per step), a redrawn bar on one."""

from __future__ import annotations

import io

from libs.service.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_once_per_tenth_with_figures():
    out = io.StringIO()
    with Progress("building", 2**30, "MiB", stream=out, scale=2**20) as bar:
        for done in range(0, 2**30 + 1, 2**24):  # 65 updates
            bar.update(done, "stage 0")
    lines = out.getvalue().splitlines()
    assert len(lines) == 11 and "\r" not in out.getvalue()
    assert lines[0].startswith("building:   0.0%") and lines[-1] == "building: 100.0%  1,024.0/1,024.0 MiB  stage 0"


def test_steps_are_lines_and_stay_short_of_the_end_until_finished():
    out = io.StringIO()
    bar = Progress("installing route", 3, "steps", stream=out)
    for message in ("planning", "plan p", "artifacts", "loading stage 0", "warming"):
        bar.step(message)
    bar.finish("route ready")
    lines = out.getvalue().splitlines()
    assert [line.rsplit("  ", 1)[-1] for line in lines] == [
        "planning", "plan p", "artifacts", "loading stage 0", "warming", "route ready"]
    assert all("100.0%" not in line for line in lines[:-1]) and "100.0%" in lines[-1]


def test_a_terminal_gets_one_redrawn_bar():
    out = _Terminal()
    with Progress("max warmup", 5, "graphs", stream=out) as bar:
        for done in range(6):
            bar.update(done, "compiling")
    text = out.getvalue()
    assert "\r" in text and "max warmup" in text and "5/5" in text
    assert text.count("\n") <= 1
