"""Send a frozen, token-counted inventory at a set load; record every request and the server's state."""
