import sys

from rl_eval.cli import main

sys.exit(main())
