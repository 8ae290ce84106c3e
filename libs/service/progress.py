"""Progress of long commands: a tqdm bar on a terminal, plain lines otherwise.

Plain lines (logs, CI, pipes) come once per tenth of the work and at the end, each a complete
line a log reader can parse; a terminal gets one redrawn bar. Both go to stderr, so stdout
stays the command's result.
"""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm

PLAIN_STEPS = 10


class Progress:
    def __init__(self, label: str, total: float, unit: str = "it", stream: TextIO | None = None,
                 interactive: bool | None = None, scale: float = 1.0) -> None:
        """`scale` divides raw counts for display (2**20 shows bytes as MiB)."""
        self._stream = stream or sys.stderr
        self._label, self._total, self._unit, self._scale = label, total, unit, scale
        self._interactive = self._stream.isatty() if interactive is None else interactive
        self._done: float = 0
        self._printed_step = -1
        shown_total = total if scale == 1 else total / scale
        self._bar = (tqdm(total=shown_total, desc=label, unit=unit, file=self._stream,
                          dynamic_ncols=True, leave=True, bar_format=None)
                     if self._interactive else None)

    def update(self, done: float, detail: str = "") -> None:
        """Absolute progress: `done` of `total` (raw units)."""
        done = min(done, self._total)
        if self._bar is not None:
            step = done - self._done
            self._bar.update(step if self._scale == 1 else step / self._scale)
            if detail:
                self._bar.set_postfix_str(detail, refresh=False)
        else:
            step = int(PLAIN_STEPS * done / self._total) if self._total else PLAIN_STEPS
            if step != self._printed_step:
                self._line(done, detail)
                self._printed_step = step
        self._done = done

    def advance(self, detail: str = "") -> None:
        """One more unit of work."""
        self.update(self._done + 1, detail)

    def step(self, message: str) -> None:
        """A step of an action whose step count is an estimate: the bar moves but stays short
        of the end until `finish`; without a terminal every step is its own line."""
        done = min(self._done + 1, max(self._total - 1, 0))
        if self._bar is not None:
            self.update(done, message)
        else:
            self._line(done, message)
            self._done = done

    def finish(self, message: str = "done") -> None:
        if self._bar is not None:
            self.update(self._total, message)
        else:
            self._line(self._total, message)
            self._done = self._total

    def _line(self, done: float, detail: str) -> None:
        share = done / self._total if self._total else 1.0
        figures = f"{done / self._scale:,.1f}/{self._total / self._scale:,.1f} {self._unit}"
        suffix = f"  {detail}" if detail else ""
        print(f"{self._label}: {share:6.1%}  {figures}{suffix}", file=self._stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
