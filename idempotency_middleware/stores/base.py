"""The store protocol's old home: see :mod:`.protocol`."""

from .protocol import *  # noqa: F403
from .protocol import CLAIMED as CLAIMED
from .protocol import TAKEN_OVER as TAKEN_OVER
