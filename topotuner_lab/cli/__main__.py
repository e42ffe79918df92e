"""``python -m topotuner_lab.cli``: the same as the ``topotuner-lab`` command."""

from topotuner_lab.cli import main

raise SystemExit(main())
