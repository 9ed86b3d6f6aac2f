"""State of simulated hypervisors and their VMs."""
