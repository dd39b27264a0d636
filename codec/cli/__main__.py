"""``python -m codec.cli``: the same program as the ``gradcodec`` console script."""

import sys

from codec.cli import main

sys.exit(main())
