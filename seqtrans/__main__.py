import os
import sys

# 'python -m seqtrans' (and torchrun's ranks) put the working directory first on sys.path;
# plugins and what they import come from installed places only, never from files that
# happen to lie where the command is run
if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from seqtrans.cli import main  # noqa: E402

sys.exit(main())
