"""``python -m idempotency_middleware``: the operator command line (see ``cli.py``)."""

import sys

from .cli.main import main

sys.exit(main())
