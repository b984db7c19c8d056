import sys

from seqtrans.cli import main

sys.exit(main())
