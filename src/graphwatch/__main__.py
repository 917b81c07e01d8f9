"""``python -m graphwatch`` is the ``graphwatch`` command."""

from .cli import main

raise SystemExit(main())
