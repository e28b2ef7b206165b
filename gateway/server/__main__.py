"""``python -m gateway.server``: the same as ``smqp-gateway``."""

from gateway.server.main import main

main()
