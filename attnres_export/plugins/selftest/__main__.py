"""``python -m attnres_export.plugins.selftest``: the GPU self-test (``attnres_export.plugins.selftest.run``)."""

import sys

from attnres_export.plugins.selftest.run import main

sys.exit(main())
