"""torchrun of Debian's python3-torch 1.13, made to start under Python 3.11 (test/e2e_dist.sh).

Its Std.from_str (the --redirects/--tee parser) compares an Enum member with an int, which Python
3.11 answers False, so every launch fails in start_processes on a None. The tests want no
redirection anyway: the parser answers "none" here, and everything else is torchrun's own.
Usage: torchrun.py TORCHRUN_ARGS... (as torchrun)."""
import sys

import torch.distributed.elastic.multiprocessing.api as api

api.Std.from_str = classmethod(lambda cls, value: api.Std.NONE)

from torch.distributed.run import main  # noqa: E402 (after the repair)

sys.exit(main())
