import sys

from federation.main import main

sys.exit(main())
