import sys

from scaletrain.cli.main import main

sys.exit(main())
