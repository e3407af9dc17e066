"""``python -m asrkit.scoring DIR ...``: the same as ``asrkit score``."""
import sys

from asrkit.scoring.report import main

sys.exit(main())
