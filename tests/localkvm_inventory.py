"""The private libvirtd (``tools/localkvm.py``) and the test guest as vclmgr's rows: a host in
the inventory and an image, for the tests and benchmarks that run real guests. Django is needed
here, unlike in ``tests/realvm.py``: the services are imported on first use."""


def kvm_host(uri, pool, name="kvm-local", *, actor="test", options=(), **fields):
    """The libvirtd at ``uri`` as the host ``name``: software emulation, its own storage pool
    ``pool``, user-mode networking (a guest is reached through a forward on 127.0.0.1), small
    unless ``fields`` says otherwise; ``options``: more driver options."""
    from inventory import services as inventory

    sizes = {"cpus": 2, "memory_mib": 2048, "disk_gib": 20, "cpu_ratio": 4}
    driver_options = {"domain_type": "qemu", "pool": pool, "network": "user", "name": name, **dict(options)}
    return inventory.create_hypervisor(
        actor=actor,
        name=name,
        address="127.0.0.1",
        driver="libvirt",
        uri=uri,
        driver_options=driver_options,
        **{**sizes, **fields},
    )


def kvm_guest_image(info, name, *, actor="test", boot="kernel", **fields):
    """``name``: the test guest (``tools/guest-image``; ``info`` is ``realvm.guest_image()``) as
    a KVM image, at the guest's own small sizes unless ``fields`` says otherwise.

    ``boot="kernel"``: its variant boots the guest's kernel and initrd directly with its command
    line (about 4 CPU-seconds to boot under emulation, against 7 from the disk: no BIOS reads,
    no boot loader, no self-decompressing kernel); ``"disk"``: the disk's own boot loader, as a
    real image boots (for tests about exactly that: a captured or uploaded disk, the demo)."""
    from provisioning import services

    if boot not in ("kernel", "disk"):
        raise ValueError(f"boot {boot!r}: kernel or disk")
    sizes = {"min_memory_mib": 128, "default_memory_mib": 256, "min_disk_gib": 0, "default_disk_gib": 1}
    image = services.create_image(actor=actor, name=name, **{"os": "Debian 12 test guest", **sizes, **fields})
    kernel = {}
    if boot == "kernel":
        kernel = {"kernel": str(info["dir"] / "vmlinux"), "initrd": str(info["dir"] / "initrd")}
        kernel["kernel_args"] = info["cmdline"]
    services.add_variant(
        image, actor=actor, hypervisor_type="kvm", format="qcow2", location=str(info["dir"] / "disk.qcow2"), **kernel
    )
    return image


def two_kvm_hosts(two, *, shared, actor="test", **fields):
    """The two hosts of ``tests/twohosts.py`` as two KVM hypervisors: their guests on the
    segment both hosts see (``bridge:br0``), their disks in the ``shared`` pool (live
    migration moves memory only; QEMU's page cache off, as libvirt requires for that) or in
    each host's ``local`` pool (migration copies the disk); ``fields``: more of each host's."""
    from tests import twohosts

    options = {"network": f"bridge:{twohosts.BRIDGE}", "disk_cache": "none"}
    if shared:
        options["shared_storage"] = True
    pool = twohosts.SHARED_POOL if shared else twohosts.LOCAL_POOL
    return [kvm_host(host.uri, pool, host.name, actor=actor, options=options, **fields) for host in two.hosts]
