"""Machines made of Linux network namespaces: a star of veth pairs on a bridge in a hub namespace.

``Network(prefix)`` makes the hub (``<prefix>hub``, a bridge with no address) and
``add(name, address)`` a machine: a namespace ``<prefix><name>`` with loopback up and
``eth0`` at ``address``/24, whose peer end is plugged into the hub's bridge. ``cut(name)``
takes that peer (the machine's switch port) down: the machine keeps its address and sockets,
its packets go nowhere and nobody gets a reset, like a pulled cable; ``mend(name)`` plugs it
back. ``close()`` deletes every namespace it made (their veths go with them).

Namespaces are named after the creating process (``vclt<pid>-``) so that ``sweep_stale()``
removes what a run killed before its clean-up left behind, and only that.
"""

import os
import re
import subprocess

SUBNET = "10.77.0"
NAME_RE = re.compile(r"^vclt(\d+)-")


def ip(*args, netns=None):
    command = ["ip", *(["-n", netns] if netns else []), *args]
    subprocess.run(command, check=True, capture_output=True, text=True)


def sweep_stale():
    """Delete ``vclt<pid>-*`` namespaces whose creating process is gone."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.strip() else ""
        match = NAME_RE.match(name)
        if match and not os.path.exists(f"/proc/{match.group(1)}"):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)


class Network:
    def __init__(self, prefix=None):
        sweep_stale()
        self.prefix = prefix or f"vclt{os.getpid()}-"
        self.hub = self.prefix + "hub"
        self.machines = {}  # name -> (namespace, address, port name in the hub)
        self.made = []
        self._namespace(self.hub)
        ip("link", "add", "br0", "type", "bridge", netns=self.hub)
        ip("link", "set", "br0", "up", netns=self.hub)

    def _namespace(self, name):
        subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
        self.made.append(name)
        ip("link", "set", "lo", "up", netns=name)

    def add(self, name, host_number):
        """A machine at ``10.77.0.<host_number>``; returns its namespace."""
        ns, address = self.prefix + name, f"{SUBNET}.{host_number}"
        port = f"p{host_number}"
        self._namespace(ns)
        ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns, netns=self.hub)
        ip("link", "set", port, "master", "br0", "up", netns=self.hub)
        ip("addr", "add", f"{address}/24", "dev", "eth0", netns=ns)
        ip("link", "set", "eth0", "up", netns=ns)
        self.machines[name] = (ns, address, port)
        return ns

    def namespace(self, name):
        return self.machines[name][0]

    def address(self, name):
        return self.machines[name][1]

    def cut(self, name):
        ip("link", "set", self.machines[name][2], "down", netns=self.hub)

    def mend(self, name):
        ip("link", "set", self.machines[name][2], "up", netns=self.hub)

    def pids(self, name):
        """Every process running in the machine's namespace (``ip netns pids``)."""
        out = subprocess.run(["ip", "netns", "pids", self.namespace(name)], capture_output=True, text=True).stdout
        return [int(pid) for pid in out.split()]

    def close(self):
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        self.made = []
