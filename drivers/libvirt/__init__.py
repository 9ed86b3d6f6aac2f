"""libvirt driver (KVM/QEMU); importing this package does not import libvirt."""
