"""`python -m rl_submit`: the same command as `rl-submit`."""

import sys

from rl_submit.cli import main

sys.exit(main())
