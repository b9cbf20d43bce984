"""Start-up trims shared by the two entry points (`geniex serve` and `python -m workers`)."""

from __future__ import annotations

import sys


def skip_rich() -> None:
    """Keep `rich` out of the process: structlog imports it (about 70 ms of a 0.5 s start
    here, measured with `python -X importtime`) only to pretty-print tracebacks on a
    developer console. Our logs are JSON lines, or plain lines on a TTY, and never use it."""
    sys.modules.setdefault("rich", None)  # type: ignore[arg-type]  # None: `import rich` raises ImportError
