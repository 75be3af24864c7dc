"""Where commands write: the console (stdout), the error console (stderr), a JSON document.

Both consoles print text as given (`SafeConsole`: terminal control characters a run's data may
hold are shown, not obeyed) and never wrap it: a line a script greps stays one line.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from loopwright.display import SafeConsole

console = SafeConsole(highlight=False, soft_wrap=True)
errors = SafeConsole(stderr=True, highlight=False, soft_wrap=True)


def print_json(document: dict[str, Any]) -> None:
    """A `--json` document on stdout, alone (`loopwright.reports` names each one's schema)."""
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")
