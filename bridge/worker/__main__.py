"""``python -m bridge.worker``: the bridge worker (``bridge.worker.lanes``)."""

from bridge.worker.lanes import main

main()
