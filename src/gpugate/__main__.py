"""``python -m gpugate`` is the ``gpugate`` command."""

from gpugate.cli import main

raise SystemExit(main())
