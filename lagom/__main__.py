import sys

from lagom import console_main

sys.exit(console_main())
