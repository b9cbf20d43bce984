"""The HTTP gateway: validates, routes to workers, relays, accounts."""
