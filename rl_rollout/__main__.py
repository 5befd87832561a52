import sys

from rl_rollout.cli import main

sys.exit(main())
