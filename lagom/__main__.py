import sys

from lagom.cli import main

sys.exit(main())
