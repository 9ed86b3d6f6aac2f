"""Models of the provisioning app."""
