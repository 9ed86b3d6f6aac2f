"""Models of the inventory app."""
