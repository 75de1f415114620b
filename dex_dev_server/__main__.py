"""``python -m dex_dev_server``: see :mod:`dex_dev_server._cli`."""

from ._cli import main

raise SystemExit(main())
