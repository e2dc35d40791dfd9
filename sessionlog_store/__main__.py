"""`python -m sessionlog_store ...` is the `sessionlog` command."""
import sys

from sessionlog_store.server.cli import main

sys.exit(main())
