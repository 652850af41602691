import sys

import lagom

sys.exit(lagom.console_main())
