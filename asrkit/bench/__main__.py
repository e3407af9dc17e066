import sys

from asrkit.bench import main

sys.exit(main())
