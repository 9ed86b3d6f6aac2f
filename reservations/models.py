"""Models of the reservations app."""
