"""VMware driver (pyVmomi); importing this package does not import pyVmomi."""
