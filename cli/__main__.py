import sys

from rocketray.cli.main import main

sys.exit(main())
