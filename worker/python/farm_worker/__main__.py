"""python -m farm_worker: the same as the farm-worker-py command."""
import sys

from .cli import main

sys.exit(main())
