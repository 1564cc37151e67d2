"""Serving a policy to a robot: `dvla serve` (server.py) and a torch-free client (client.py) that
speak openpi's websocket wire format (wire.py)."""
