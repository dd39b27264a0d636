"""``python -m codec.fuzzing --child ...``: the supervised child of :func:`codec.fuzzing.supervise`."""

from __future__ import annotations

import sys

from codec.fuzzing.loop import child_main

if __name__ == "__main__":
    sys.exit(child_main())
