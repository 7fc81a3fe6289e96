"""Jobs, their attempts and the containers (task runs) of each attempt.

The database is the source of truth: the supervisor reads desired state from
here and writes what Docker reports back here; websockets only announce that
a row changed.
"""

from .catalogue import *  # noqa: F403
from .events import *  # noqa: F403
from .job import *  # noqa: F403
from .preferences import UserPreference  # noqa: F401
from .resources import ResourceSeries  # noqa: F401
from .rules import MASK, environment_errors, tag_errors  # noqa: F401
from .runs import *  # noqa: F403
from .storage import Bucket  # noqa: F401
