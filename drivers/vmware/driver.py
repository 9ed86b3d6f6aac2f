"""The VMware driver (vCenter or a standalone ESXi host, through pyVmomi).

``VMwareDriver("https://vcenter.example.org/sdk?host=esx01.example.org", credentials=
{"username", "password"}, options={...})``; credentials may also come from the URI's user
info. Options: ``host`` (the HostSystem this driver places VMs on; may be omitted when the
connection sees only one), ``datastore`` (default: the host's accessible datastore with
most free space), ``network`` (port group used for the spec's ``default`` network, default
``VM Network``), ``insecure`` (skip TLS certificate checks), ``task_timeout`` (seconds,
default 600), ``stop_timeout`` (graceful shutdown, default 120), ``tools_timeout`` (seconds a
warm guest's VMware Tools are waited for when it is handed a login, default 15),
``extra_config`` (a dict of VM advanced settings added to every VM this driver creates; a
spec's own come after).

VMs are created in the datacenter's VM folder, named by their key; a name is unique per
folder, so lifecycle calls find the VM wherever DRS has moved it. ``create`` either clones a
template (image format ``template``; the location is the template's name) or builds a VM
from a ConfigSpec whose disk is a delta (child) disk on the staged base ``vmdk`` — the
vSphere form of a qcow2 overlay. ``stage_image`` uploads a verified vmdk into
``[datastore] vclmgr-images/`` (as ``.part``, then moved into place). ``capture`` clones a
stopped VM to a template. ``migrate`` relocates (vMotion) within one vCenter. Graceful stop
asks VMware Tools and powers off when the guest has no tools.

The guest's first-boot configuration (``spec.guest``) travels as guestinfo in the VM's
extraConfig (``vmware/guestinfo.py`` names the keys and encodings), which cloud-init's VMware
datasource (and cloudbase-init's VMwareGuestInfoService) read through VMware Tools. The seed is
written last, so no ``extra_config`` can replace the login; a clone always overwrites the
template's seed (a template captured from a VM would otherwise hand out that VM's login), and
``capture`` clears it from the new template. ``reseed(key, guest)`` replaces it on a stopped VM
(after a revert, which restores the snapshot's extraConfig with its seed). ``info()`` and
``list_vms()`` never carry extraConfig values; errors name keys, never values.

Private networks (environments) are port groups on the host's vSwitch ``vclmgr-private``,
which has no uplink, each on a VLAN of its own (``vmware/networks.py``); a VM's ``private_networks`` are vmxnet3 NICs on
them, with the spec's MACs. A network on an overlay is a distributed port group of the switch
named as the overlay instead (``vmware/overlay.py``). No DHCP or DNS there: the guests configure
their addresses.

The guest command channel (batch runs) is vSphere's guest operations (``vmware/guestops.py``),
logged in as the image's service account: ``credentials["guest"]`` (``{"username",
"password"}``, the vmware variant's guest login); a VM whose image has none is refused before
any call.

A snapshot of a running VM keeps its memory, so a revert gives the running guest back (a warm
VM's ``warm`` snapshot). ``personalise`` hands a warm guest to its user through guest
operations as the same service account (``vmware/handover.py``), once its Tools run.

Console: vSphere's own is WebMKS (``VirtualMachine.AcquireTicket("webmks")`` gives host, port
and a one-time ticket for ``wss://<esx>:<port>/ticket/<ticket>``, spoken by VMware's HTML
console SDK, not by noVNC); vclmgr does not proxy it yet, so ``console_address`` and
``serial_console`` answer ``NoConsole`` and say so. (ESXi dropped its built-in VNC server in
7.0, so ``RemoteDisplay.vnc.*`` settings are no way around it.)
"""

import contextlib
import http.client
import os
import ssl
import time
import urllib.parse
from xml.etree import ElementTree

from django.conf import settings
from pyVim.connect import Connect, getSslContext
from pyVmomi import vim, vmodl
from pyVmomi.VmomiSupport import GetServiceVersions, versionIdMap

from drivers import base
from drivers.base import Conflict, DriverError, HostFacts, Invalid, NotFound, Unreachable, VMInfo, VMState
from drivers.cloudinit import SeedError
from drivers.vmware import guestinfo, guestops, handover, networks
from drivers.vmware.session import sessions, translate, translated

IMAGE_FOLDER = "vclmgr-images"
GIB, MIB = 1 << 30, 1 << 20
POWER_STATES = {"poweredOn": VMState.RUNNING, "poweredOff": VMState.STOPPED, "suspended": VMState.SUSPENDED}
VM_PROPS = ["name", "runtime.host", "runtime.powerState", "config.template", "summary.config.numCpu",
            "summary.config.memorySizeMB"]  # fmt: skip

# What a running VM's resize needs enabled: (ConfigSpec field, its words, the VM's flag).
HOT_ADD = (("numCPUs", "CPU", "config.cpuHotAddEnabled"), ("memoryMB", "memory", "config.memoryHotAddEnabled"))


class VMwareDriver(base.Driver):
    kind = "vmware"
    moves_suspended = True  # a relocation (cold migration) carries a suspended VM's .vmss with it
    supports_networks = True

    def __init__(self, uri, credentials=None, options=None):
        super().__init__(uri, credentials, options)
        parts = urllib.parse.urlsplit(uri or "")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise Invalid(f"{uri!r} is not a vSphere URL (https://vcenter.example.org/sdk)")
        query = urllib.parse.parse_qs(parts.query)
        self.wanted_host = self.options.get("host") or query.get("host", [None])[0]
        self.username = self.credentials.get("username") or urllib.parse.unquote(parts.username or "")
        self.password = self.credentials.get("password") or urllib.parse.unquote(parts.password or "")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self.endpoint = (parts.scheme, parts.hostname, port, parts.path or "/sdk")
        self._cache = {}

    # --- connection and lookups -----------------------------------------------------------

    def connect(self):
        scheme, hostname, port, path = self.endpoint
        # pyVim's SmartConnect first reads the API versions without any timeout (a silent
        # endpoint held it for ever): read them here under ours, then sign in with Connect.
        context = getSslContext(hostname, None, bool(self.options.get("insecure"))) if scheme == "https" else None
        try:
            version = self._api_version(context or ssl.create_default_context())
            return Connect(
                host=hostname,
                port=port if scheme == "https" else -port,  # pyVim's way of saying plain http
                path=path,
                user=self.username,
                pwd=self.password,
                version=version,
                sslContext=context,
                httpConnectionTimeout=settings.VCLMGR_VSPHERE_TIMEOUT,
            )
        except Exception as exc:  # noqa: BLE001 (translated: faults, socket and TLS errors)
            raise translate(exc, f"cannot connect to {hostname}:{port} as {self.username or '(nobody)'}") from exc

    def _api_version(self, context):
        """The newest vim25 API version both pyVmomi and the endpoint speak, as SmartConnect picks it."""
        scheme, hostname, port, path = self.endpoint
        timeout = settings.VCLMGR_VSPHERE_TIMEOUT
        if scheme == "https":
            conn = http.client.HTTPSConnection(hostname, port, timeout=timeout, context=context)
        else:
            conn = http.client.HTTPConnection(hostname, port, timeout=timeout)
        try:
            conn.request("GET", f"{path}/vimServiceVersions.xml")
            response = conn.getresponse()
            body = response.read(1 << 20)
        finally:
            conn.close()
        offered = set()
        if response.status == 200:
            with contextlib.suppress(ElementTree.ParseError):
                offered = {element.text for element in ElementTree.fromstring(body).iter("version")}
        for version in GetServiceVersions("vim25"):
            if versionIdMap[version] in offered:
                return version
        raise Invalid(f"{hostname}:{port} is not a vSphere API endpoint (no API version it offers is known here)")

    @property
    def si(self):
        return sessions.get(self)

    def close(self):
        self._cache.clear()

    def _call(self, context, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except DriverError:
            raise
        except Exception as exc:  # noqa: BLE001 (translated below)
            if isinstance(exc, vim.fault.NotAuthenticated):
                sessions.forget(self)  # the session expired: the retry logs in again
            raise translate(exc, context) from exc

    def _wait(self, task, context):
        """The task's result; its fault translated; a temporary error when it outlasts task_timeout."""
        timeout = float(self.options.get("task_timeout", 600))
        deadline, delay = time.monotonic() + timeout, 0.02
        while True:
            info = self._props(task, ["info.state", "info.error", "info.result"], context)
            if info.get("info.state") == vim.TaskInfo.State.success:
                return info.get("info.result")
            if info.get("info.state") == vim.TaskInfo.State.error:
                error = info["info.error"]  # a LocalizedMethodFault (vcsim's may come as the bare fault)
                fault = getattr(error, "fault", error)
                if not getattr(fault, "msg", None):
                    fault.msg = getattr(error, "localizedMessage", None) or ""
                raise translate(fault, context)
            if time.monotonic() > deadline:
                state = info.get("info.state")
                raise DriverError(f"{context}: task still {state} after {timeout:g} s", permanent=False)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _props(self, obj, paths, context=None):
        """{path: value} of one object, unset properties left out, in one round trip.

        Reading properties this way, rather than as attributes, fetches only what we need and
        copes with unset ones (the simulator fails attribute reads of unset properties, and
        reports a FileManager as a task's entity, which pyVmomi rejects).
        """
        pc = vmodl.query.PropertyCollector
        spec = pc.FilterSpec(
            objectSet=[pc.ObjectSpec(obj=obj)], propSet=[pc.PropertySpec(type=type(obj), pathSet=paths)]
        )
        result = self._call(
            context or f"read {obj._moId}",
            self.si.content.propertyCollector.RetrievePropertiesEx,
            [spec],
            pc.RetrieveOptions(),
        )
        return {prop.name: prop.val for prop in result.objects[0].propSet} if result and result.objects else {}

    def _collect(self, vimtype, props, root=None):
        """[(object, {property: value})] for every ``vimtype`` under ``root``, in one round trip per page."""
        content = self.si.content
        view = self._call(
            "create view", content.viewManager.CreateContainerView, root or content.rootFolder, [vimtype], True
        )
        pc = vmodl.query.PropertyCollector
        spec = pc.FilterSpec(
            objectSet=[
                pc.ObjectSpec(
                    obj=view,
                    skip=True,
                    selectSet=[pc.TraversalSpec(name="view", path="view", skip=False, type=vim.view.ContainerView)],
                )
            ],
            propSet=[pc.PropertySpec(type=vimtype, pathSet=props)],
        )
        try:
            result = self._call("collect", content.propertyCollector.RetrievePropertiesEx, [spec], pc.RetrieveOptions())
            objects = []
            while result is not None:
                objects += [(item.obj, {p.name: p.val for p in item.propSet}) for item in result.objects]
                token = result.token
                result = content.propertyCollector.ContinueRetrievePropertiesEx(token) if token else None
            return objects
        finally:
            with contextlib.suppress(Exception):
                view.Destroy()

    def _host(self):
        if "host" not in self._cache:
            hosts = self._collect(vim.HostSystem, ["name"])
            if self.wanted_host:
                match = [h for h, props in hosts if props["name"].lower() == self.wanted_host.lower()]
                if not match:
                    names = ", ".join(sorted(props["name"] for _, props in hosts)) or "none"
                    raise NotFound(f"no host {self.wanted_host!r} at {self.endpoint[1]} (it has: {names})")
            elif len(hosts) == 1:
                match = [hosts[0][0]]
            else:
                raise Invalid(f"{self.endpoint[1]} manages {len(hosts)} hosts; name one with ?host=<name>")
            self._cache["host"] = match[0]
        return self._cache["host"]

    @property
    def host_name(self):
        return self._host().name

    def _datacenter(self):
        if "dc" not in self._cache:
            entity = self._host()
            while entity is not None and not isinstance(entity, vim.Datacenter):
                entity = entity.parent
            if entity is None:
                raise NotFound(f"host {self.host_name} is in no datacenter")
            self._cache["dc"] = entity
        return self._cache["dc"]

    def _resource_pool(self):
        return self._host().parent.resourcePool

    def _datastore(self):
        if "ds" not in self._cache:
            stores = [ds for ds in self._host().datastore if ds.summary.accessible]
            wanted = self.options.get("datastore")
            if wanted:
                stores = [ds for ds in stores if ds.name == wanted]
            if not stores:
                raise NotFound(f"no accessible datastore {wanted or ''} on host {self.host_name}".replace("  ", " "))
            self._cache["ds"] = max(stores, key=lambda ds: ds.summary.freeSpace)
        return self._cache["ds"]

    def _find(self, name):
        """The VM or template called ``name`` in the datacenter's VM folder, or None."""
        content = self.si.content
        found = self._call(f"find {name}", content.searchIndex.FindChild, self._datacenter().vmFolder, name)
        return found if isinstance(found, vim.VirtualMachine) else None

    def _vm(self, key):
        base.check_key(key)
        vm = self._find(key)
        if vm is None or self._props(vm, ["config.template"]).get("config.template"):
            raise NotFound(f"no VM {key} at {self.endpoint[1]}")
        return vm

    def _state(self, vm):
        return POWER_STATES.get(str(self._props(vm, ["runtime.powerState"]).get("runtime.powerState")), VMState.ERROR)

    # --- host -----------------------------------------------------------------------------

    @translated
    def facts(self):
        host = self._host()
        summary = self._call(f"summary of {host.name}", lambda: host.summary)
        hardware, stats = summary.hardware, summary.quickStats
        ds = self._datastore()
        vms = self.list_vms()
        memory_mib = hardware.memorySize // MIB
        vnics = self._props(host, ["config.network.vnic"]).get("config.network.vnic") or []
        addresses = [nic.spec.ip.ipAddress for nic in vnics if nic.spec and nic.spec.ip and nic.spec.ip.ipAddress]
        return HostFacts(
            name=summary.config.name,
            hypervisor_type=self.hypervisor_type,
            version=summary.config.product.fullName,
            cpus=hardware.numCpuCores,
            memory_mib=memory_mib,
            disk_gib=ds.summary.capacity // GIB,
            free_memory_mib=max(0, memory_mib - (stats.overallMemoryUsage or 0)),
            free_disk_gib=ds.summary.freeSpace // GIB,
            vms=len(vms),
            running_vms=sum(1 for vm in vms if vm.state == VMState.RUNNING),
            extra={
                "cpu_mhz": hardware.cpuMhz,
                "cpu_model": hardware.cpuModel,
                "datastore": ds.name,
                "datacenter": self._datacenter().name,
                "cluster": host.parent.name,
                "connection_state": str(summary.runtime.connectionState),
                "maintenance": bool(summary.runtime.inMaintenanceMode),
                "address": addresses[0] if addresses else None,  # the management interface's
            },
        )

    @translated
    def discover(self):
        names = sorted(props["name"] for _, props in self._collect(vim.HostSystem, ["name"]))
        return [type(self)(self.uri, self.credentials, {**self.options, "host": name}).facts() for name in names]

    @translated
    def list_vms(self):
        host = self._host()
        result = []
        for _vm, props in self._collect(vim.VirtualMachine, VM_PROPS):
            on_host = props.get("runtime.host") is not None and props["runtime.host"]._moId == host._moId
            if not on_host or props.get("config.template"):
                continue
            result.append(_vm_info(props, host.name))
        return result

    # --- images ---------------------------------------------------------------------------

    @translated
    def stage_image(self, image):
        self.check_image(image)
        if image.format == "template":
            self._template(image)
            return image.location
        existing = self._staged_vmdk(image)
        if existing:
            return existing
        ds = self._datastore()
        relative = f"{IMAGE_FOLDER}/{base.staged_name(image, '.vmdk')}"
        with base.fetched(image) as path:
            self._put(ds, relative + ".part", path)
        fm = self.si.content.fileManager
        dc = self._datacenter()
        task = self._call(
            "move staged image",
            fm.MoveDatastoreFile_Task,
            sourceName=f"[{ds.name}] {relative}.part",
            sourceDatacenter=dc,
            destinationName=f"[{ds.name}] {relative}",
            destinationDatacenter=dc,
            force=True,
        )
        self._wait(task, f"stage {image.name}")
        return f"[{ds.name}] {relative}"

    def _template(self, image):
        template = self._find(image.location)
        if template is None:
            raise NotFound(f"image {image.name}: no template {image.location!r} at {self.endpoint[1]}")
        return template

    @translated
    def unstage_image(self, location):
        ds_name, _, relative = location[1:].partition("] ") if location.startswith("[") else ("", "", "")
        if not relative.startswith(f"{IMAGE_FOLDER}/"):  # a template or the library's own disk
            raise Invalid(f"{location} is no disk vclmgr staged on {self.host_name}")
        ds = next((ds for ds in self._host().datastore if ds.name == ds_name), None)
        if ds is None or not self._exists(ds, relative):
            return False
        fm = self.si.content.fileManager
        task = self._call(
            "delete staged image", fm.DeleteDatastoreFile_Task, name=location, datacenter=self._datacenter()
        )
        self._wait(task, f"delete {location}")
        return True

    def _staged_vmdk(self, image):
        """The datastore path of the staged base disk, or None when it is not there."""
        if image.location.startswith("["):  # already on a datastore
            ds_name, _, relative = image.location[1:].partition("] ")
            ds = next((ds for ds in self._host().datastore if ds.name == ds_name), None)
            return image.location if ds is not None and self._exists(ds, relative) else None
        ds = self._datastore()
        relative = f"{IMAGE_FOLDER}/{base.staged_name(image, '.vmdk')}"
        return f"[{ds.name}] {relative}" if self._exists(ds, relative) else None

    def _http(self):
        scheme, hostname, port, _path = self.endpoint
        if scheme == "http":
            return http.client.HTTPConnection(hostname, port, timeout=settings.VCLMGR_VSPHERE_TIMEOUT)
        context = ssl._create_unverified_context() if self.options.get("insecure") else ssl.create_default_context()  # noqa: S323
        return http.client.HTTPSConnection(hostname, port, timeout=settings.VCLMGR_VSPHERE_TIMEOUT, context=context)

    def _file_url(self, ds, relative):
        query = urllib.parse.urlencode({"dcPath": self._datacenter().name, "dsName": ds.name})
        return f"/folder/{urllib.parse.quote(relative)}?{query}"

    def _request(self, method, ds, relative, body=None, size=None):
        cookie = self.si._stub.cookie.split(";", 1)[0]
        headers = {"Cookie": cookie}
        if size is not None:
            headers.update({"Content-Length": str(size), "Content-Type": "application/octet-stream"})
        conn = self._http()
        try:
            conn.request(method, self._file_url(ds, relative), body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            return response.status
        except (OSError, http.client.HTTPException) as exc:
            raise translate(exc, f"{method} [{ds.name}] {relative}") from exc
        finally:
            conn.close()

    def _exists(self, ds, relative):
        status = self._request("HEAD", ds, relative)
        if status >= 500:
            raise Unreachable(f"datastore {ds.name} answered {status}")
        return status == 200

    def _put(self, ds, relative, path):
        with open(path, "rb") as body:
            status = self._request("PUT", ds, relative, body=body, size=os.path.getsize(path))
        if status not in (200, 201, 204):
            raise DriverError(f"upload to [{ds.name}] {relative} answered {status}", permanent=status < 500)

    # --- lifecycle ------------------------------------------------------------------------

    @translated
    def create(self, spec):
        spec.validate()
        self.check_image(spec.image)
        existing = self._find(spec.key)
        if existing is not None:
            return self._adopt(existing, spec)
        networks.check_macs(spec)
        networks.check_on_host(self, spec)
        folder, pool, host = self._datacenter().vmFolder, self._resource_pool(), self._host()
        try:
            if spec.image.format == "template":
                vm = self._clone(spec, folder, pool, host)
            else:
                config = self._config_spec(spec)
                vm = self._wait(
                    self._call(f"create {spec.key}", folder.CreateVM_Task, config=config, pool=pool, host=host),
                    f"create {spec.key}",
                )
        except Conflict:
            existing = self._find(spec.key)  # a concurrent create won the race
            if existing is None:
                raise
            return self._adopt(existing, spec)
        return self._info(vm)

    def _extra_config(self, spec, clone=False):
        values = {"vclmgr.key": spec.key, "vclmgr.fingerprint": spec.fingerprint()}
        if clone:  # a template's seed (a captured VM's login) must never reach the clone
            values.update(guestinfo.cleared())
        for extra in (self.options.get("extra_config", {}), spec.extra.get("vmware.extra_config", {})):
            values.update({str(k): str(v) for k, v in dict(extra).items()})
        if spec.guest is not None:  # last: no extra_config can replace the reservation's login
            values.update(_seed(spec.key, spec.guest))
        return _options(values)

    def _extra(self, vm):
        """The VM's extraConfig as key → value (a later entry wins, as vSphere keeps one per key)."""
        props = self._props(vm, ["config.extraConfig"])
        return {opt.key: opt.value for opt in props.get("config.extraConfig") or []}

    @translated
    def reseed(self, key, guest):
        """Replace the first-boot configuration of the stopped VM ``key`` with ``guest`` (None: none).

        Idempotent: the seed already there is left alone. A different seed must bring a new
        ``instance_id``: cloud-init applies users and passwords once per instance id, so a new
        password under the old id would silently never reach the guest.
        """
        vm = self._vm(key)
        base.check_reseed(key, self._state(vm), None, None, True)
        wanted = guestinfo.cleared() if guest is None else _seed(key, guest)
        current = self._extra(vm)
        if guestinfo.seed_of(current) == wanted[guestinfo.DIGEST]:
            return
        base.check_reseed(key, VMState.STOPPED, guestinfo.instance_id(current), guest, False)
        spec = vim.vm.ConfigSpec(extraConfig=_options(wanted))
        self._wait(self._call(f"reseed {key}", vm.ReconfigVM_Task, spec=spec), f"reseed {key}")

    def _config_spec(self, spec):
        base_path = self._staged_vmdk(spec.image)
        if base_path is None:
            raise NotFound(f"image {spec.image.name} is not staged on {self.host_name}; stage it first")
        ds = self._datastore()
        device = vim.vm.device.VirtualDeviceSpec
        scsi = vim.vm.device.ParaVirtualSCSIController(key=-100, busNumber=0, sharedBus="noSharing")
        disk = vim.vm.device.VirtualDisk(
            key=-101,
            controllerKey=-100,
            unitNumber=0,
            capacityInKB=spec.disk_gib * 1024 * 1024,
            backing=vim.vm.device.VirtualDisk.FlatVer2BackingInfo(
                fileName=f"[{ds.name}]",
                diskMode="persistent",
                thinProvisioned=True,
                parent=vim.vm.device.VirtualDisk.FlatVer2BackingInfo(fileName=base_path, diskMode="persistent"),
            ),
        )
        return vim.vm.ConfigSpec(
            name=spec.key,
            annotation=f"vclmgr {spec.key} ({spec.image.name})",
            guestId=str(spec.extra.get("vmware.guest_id", "otherGuest64")),
            numCPUs=spec.vcpus,
            memoryMB=spec.memory_mib,
            files=vim.vm.FileInfo(vmPathName=f"[{ds.name}]"),
            extraConfig=self._extra_config(spec),
            deviceChange=[
                device(operation="add", device=scsi),
                device(operation="add", fileOperation="create", device=disk),  # a child (delta) of the base
                device(operation="add", device=self._nic(spec.network)),
                *self._private_nics(spec),
            ],
        )

    def _private_nics(self, spec):
        """A vmxnet3 NIC on each private network's port group, on its MAC (``networks.py``)."""
        device = vim.vm.device.VirtualDeviceSpec
        return [
            device(operation="add", device=self._nic(key, device_key=-110 - i, mac=mac))
            for i, (key, mac) in enumerate(spec.private_networks)
        ]

    def _nic(self, network_name, device_key=-102, mac=None):
        name = self.options.get("network", "VM Network") if network_name == "default" else network_name
        network = next((net for net in self._datacenter().network if net.name == name), None)
        if network is None:
            raise NotFound(f"no network {name!r} in datacenter {self._datacenter().name}")
        nic = vim.vm.device.VirtualVmxnet3(
            key=device_key,
            addressType="manual" if mac else "generated",
            connectable=vim.vm.device.VirtualDevice.ConnectInfo(
                startConnected=True, connected=True, allowGuestControl=True
            ),
        )
        if mac:
            nic.macAddress = mac
        if isinstance(network, vim.dvs.DistributedVirtualPortgroup):
            nic.backing = vim.vm.device.VirtualEthernetCard.DistributedVirtualPortBackingInfo(
                port=vim.dvs.PortConnection(
                    portgroupKey=network.key, switchUuid=network.config.distributedVirtualSwitch.uuid
                )
            )
        else:
            nic.backing = vim.vm.device.VirtualEthernetCard.NetworkBackingInfo(deviceName=name, network=network)
        return nic

    def _clone(self, spec, folder, pool, host):
        template = self._template(spec.image)
        config = vim.vm.ConfigSpec(
            numCPUs=spec.vcpus,
            memoryMB=spec.memory_mib,
            extraConfig=self._extra_config(spec, clone=True),
            annotation=f"vclmgr {spec.key} ({spec.image.name})",
            deviceChange=self._private_nics(spec),  # after the template's own NIC
        )
        clone = vim.vm.CloneSpec(
            location=vim.vm.RelocateSpec(pool=pool, host=host, datastore=self._datastore()),
            powerOn=False,
            template=False,
            config=config,
        )
        task = self._call(f"clone {spec.key}", template.CloneVM_Task, folder=folder, name=spec.key, spec=clone)
        vm = self._wait(task, f"clone {spec.key} from {template.name}")
        # vCenter applies size and placement from the clone spec; make sure (the simulator does not).
        props = self._props(vm, ["config.hardware.numCPU", "config.hardware.memoryMB", "runtime.host"])
        size = (props.get("config.hardware.numCPU"), props.get("config.hardware.memoryMB"))
        if size != (spec.vcpus, spec.memory_mib):
            resize = vim.vm.ConfigSpec(numCPUs=spec.vcpus, memoryMB=spec.memory_mib)
            self._wait(self._call(f"resize {spec.key}", vm.ReconfigVM_Task, spec=resize), f"resize {spec.key}")
        if props["runtime.host"]._moId != host._moId:
            move = vim.vm.RelocateSpec(host=host, pool=pool)
            self._wait(self._call(f"place {spec.key}", vm.RelocateVM_Task, spec=move), f"place {spec.key}")
        return vm

    def _adopt(self, vm, spec):
        """The VM a retried create finds, as it is: its seed is kept (``reseed`` replaces one)."""
        props = self._props(vm, ["config.template", "config.extraConfig"])
        values = {opt.key: opt.value for opt in props.get("config.extraConfig") or []}
        if props.get("config.template") or values.get("vclmgr.fingerprint") != spec.fingerprint():
            where = self.endpoint[1]
            raise Conflict(f"a VM named {spec.key} already exists at {where} and was not made by this request")
        return self._info(vm)

    def _info(self, vm):
        props = self._props(vm, VM_PROPS)
        host = props["runtime.host"].name if props.get("runtime.host") else ""
        return _vm_info(props, host)

    @translated
    def start(self, key):
        vm = self._vm(key)
        if base.needs("start", key, self._state(vm)):
            self._wait(self._call(f"power on {key}", vm.PowerOnVM_Task), f"power on {key}")

    @translated
    def stop(self, key, force=False):
        vm = self._vm(key)
        if not base.needs("stop", key, self._state(vm), force):
            return
        if not force and self._ask_guest_to_stop(vm):
            base.wait_until(
                lambda: self._state(vm) == VMState.STOPPED,
                f"shutdown of {key} (stop it with force)",
                self.options.get("stop_timeout", 120),
            )
            return
        self._wait(self._call(f"power off {key}", vm.PowerOffVM_Task), f"power off {key}")

    def _ask_guest_to_stop(self, vm):
        """True when VMware Tools took the shutdown request; False when the guest cannot be asked."""
        try:
            vm.ShutdownGuest()
            return True
        except vim.fault.ToolsUnavailable:
            return False
        except Exception as exc:  # noqa: BLE001
            raise translate(exc, f"shut down {vm._moId}") from exc

    @translated
    def suspend(self, key):
        vm = self._vm(key)
        if base.needs("suspend", key, self._state(vm)):
            self._wait(self._call(f"suspend {key}", vm.SuspendVM_Task), f"suspend {key}")

    @translated
    def resume(self, key):
        vm = self._vm(key)
        if base.needs("resume", key, self._state(vm)):
            self._wait(self._call(f"resume {key}", vm.PowerOnVM_Task), f"resume {key}")

    @translated
    def destroy(self, key):
        base.check_key(key)
        vm = self._find(key)
        if vm is None:
            return
        if self._props(vm, ["config.template"]).get("config.template"):
            raise Conflict(f"{key} is a template, not a VM; refusing to delete it")
        if self._state(vm) != VMState.STOPPED:
            self._wait(self._call(f"power off {key}", vm.PowerOffVM_Task), f"power off {key}")
        try:
            self._wait(self._call(f"destroy {key}", vm.Destroy_Task), f"destroy {key}")
        except NotFound:
            pass  # gone meanwhile: that is what we wanted

    def _snapshots(self, vm):
        stack = list(self._props(vm, ["snapshot.rootSnapshotList"]).get("snapshot.rootSnapshotList") or [])
        while stack:
            tree = stack.pop()
            yield tree
            stack.extend(tree.childSnapshotList or [])

    @translated
    def snapshot(self, key, name):
        base.check_snapshot_name(name)
        vm = self._vm(key)
        if any(tree.name == name for tree in self._snapshots(vm)):
            return
        task = self._call(
            f"snapshot {key}",
            vm.CreateSnapshot_Task,
            name=name,
            description="vclmgr snapshot",
            # A running VM's memory too, so that a revert gives the running guest back (a warm
            # VM's snapshot, say), as the contract asks; a stopped VM has none to keep.
            memory=self._state(vm) == VMState.RUNNING,
            quiesce=False,
        )
        self._wait(task, f"snapshot {key} as {name!r}")

    @translated
    def revert(self, key, name):
        base.check_snapshot_name(name)
        vm = self._vm(key)
        tree = next((tree for tree in self._snapshots(vm) if tree.name == name), None)
        if tree is None:
            raise NotFound(f"{key} has no snapshot {name!r}")
        self._wait(self._call(f"revert {key}", tree.snapshot.RevertToSnapshot_Task), f"revert {key} to {name!r}")

    @translated
    def resize(self, key, vcpus, memory_mib):
        """vSphere has no definition apart from the running VM: a stopped VM is reconfigured; a
        running one only where its CPU and memory hot-add are enabled for what grows (it has
        the size at once), else a ``Conflict`` (stop it first); a suspended one never."""
        base.check_size(key, vcpus, memory_mib)
        vm = self._vm(key)
        paths = ["runtime.powerState", "summary.config.numCpu", "summary.config.memorySizeMB",
                 "config.cpuHotAddEnabled", "config.memoryHotAddEnabled"]  # fmt: skip
        props = self._props(vm, paths)
        state = POWER_STATES.get(str(props.get("runtime.powerState")), VMState.ERROR)
        changes = {}
        if props.get("summary.config.numCpu") != vcpus:
            changes["numCPUs"] = vcpus
        if props.get("summary.config.memorySizeMB") != memory_mib:
            changes["memoryMB"] = memory_mib
        if not changes:
            return base.APPLIES_NOW
        if state == VMState.SUSPENDED:
            raise Conflict(f"cannot resize {key}: it is suspended; resume and stop it first")
        if state == VMState.RUNNING:
            cold = [what for field, what, flag in HOT_ADD if field in changes and not props.get(flag)]
            if cold:
                raise Conflict(f"cannot resize {key} while it runs: {' and '.join(cold)} hot-add is off; stop it first")
        spec = vim.vm.ConfigSpec(**changes)
        self._wait(self._call(f"resize {key}", vm.ReconfigVM_Task, spec=spec), f"resize {key}")
        return base.APPLIES_NOW

    @translated
    def capture(self, key, new_image_name):
        base.check_image_name(new_image_name)
        vm = self._vm(key)
        if self._state(vm) != VMState.STOPPED:
            raise Conflict(f"cannot capture {key}: it is {self._state(vm)}; stop it first")
        template = self._find(new_image_name)
        if template is None:
            clone = vim.vm.CloneSpec(
                location=vim.vm.RelocateSpec(host=self._host(), datastore=self._datastore()),
                powerOn=False,
                template=True,
                config=vim.vm.ConfigSpec(extraConfig=_options(guestinfo.cleared())),  # the user's login stays behind
            )
            task = self._call(
                f"capture {key}", vm.CloneVM_Task, folder=self._datacenter().vmFolder, name=new_image_name, spec=clone
            )
            template = self._wait(task, f"capture {key} as {new_image_name}")
        props = self._props(template, ["config.template", "config.hardware.device"])
        if not props.get("config.template"):
            raise Conflict(f"cannot capture {key} as {new_image_name!r}: a VM of that name exists")
        disk_kb = sum(
            dev.capacityInKB
            for dev in props.get("config.hardware.device") or []
            if isinstance(dev, vim.vm.device.VirtualDisk)
        )
        return base.ImageVariantSpec(
            name=new_image_name, format="template", location=new_image_name, size_gib=-(-disk_kb // (1024 * 1024))
        )

    @translated
    def migrate(self, key, target):
        self._same_kind(target)
        if target.endpoint[:3] != self.endpoint[:3]:
            raise Invalid(f"cannot move {key} between vCenters ({self.endpoint[1]} → {target.endpoint[1]})")
        vm = self._vm(key)
        host = target._host()
        props = self._props(vm, ["runtime.host", "datastore"])
        if props["runtime.host"]._moId == host._moId:
            return  # there already (a retried migrate)
        networks.check_move(self, target, vm, key)
        spec = vim.vm.RelocateSpec(host=host, pool=target._resource_pool())
        visible = {ds._moId for ds in host.datastore}
        if not all(ds._moId in visible for ds in props.get("datastore") or []):
            spec.datastore = target._datastore()  # the target cannot see the disks: move them too
        task = self._call(
            f"migrate {key}", vm.RelocateVM_Task, spec=spec, priority=vim.VirtualMachine.MovePriority.defaultPriority
        )
        self._wait(task, f"migrate {key} to {host.name}")

    # --- private networks (vmware/networks.py) ---------------------------------------------

    @translated
    def create_network(self, spec):
        return networks.create(self, spec)

    @translated
    def delete_network(self, key):
        return networks.delete(self, key)

    @translated
    def list_networks(self):
        return networks.listed(self)

    def private_mac(self, vm_key, network_key):
        return networks.mac(vm_key, network_key)

    def console_address(self, key):
        raise base.NoConsole(
            f"{key} is a VMware VM: its console is VMware's WebMKS (vSphere Client or a WebMKS ticket), "
            "which vclmgr's noVNC console does not speak yet"
        )

    def serial_console(self, key):
        raise base.NoConsole(f"{key} is a VMware VM: vclmgr gives no serial console for VMware hosts")

    # --- the guest command channel (vmware/guestops.py) -------------------------------------

    def _guest(self, key):
        """The VM's guest operations as its image's service account; refused before any call
        to vSphere when the image has none."""
        base.check_key(key)
        login = self.credentials.get("guest") or {}
        if not login.get("username") or not login.get("password"):
            raise Invalid(
                f"{key}: VMware guest operations need a login in the guest, and its image has none (set the "
                "vmware variant's guest user and password: a service account of the template)"
            )
        return guestops.GuestChannel(self, key, self._vm(key), login)

    @translated
    def personalise(self, key, guest):
        """The warm guest's new identity and ``guest``'s login, through guest operations as the
        image's service account (``vmware/handover.py``)."""
        channel = self._guest(key)
        if self._state(channel.vm) != VMState.RUNNING:
            raise Conflict(f"{key} is not running: a login is handed only to a running guest")
        # A guest just resumed from its snapshot may report its Tools a moment later.
        deadline = time.monotonic() + float(self.options.get("tools_timeout", 15))
        while not self.agent_answers(key):
            if time.monotonic() > deadline:
                raise DriverError(
                    f"VMware Tools do not run in {key}: no guest operations to hand it a login", permanent=False
                )
            time.sleep(0.2)
        handover.personalise(channel, guest)

    @translated
    def agent_answers(self, key):
        """True when VMware Tools run in the guest (what guest operations need)."""
        props = self._props(self._vm(key), ["guest.toolsRunningStatus"])
        return props.get("guest.toolsRunningStatus") == "guestToolsRunning"

    @translated
    def guest_exec(self, key, tag, argv, env=None, workdir="/"):
        self._guest(key).start(tag, list(argv), dict(env or {}), workdir)

    @translated
    def guest_exec_status(self, key, tag, offset=0, limit=1 << 20):
        return self._guest(key).status(tag, offset, limit)

    @translated
    def guest_put_file(self, key, path, data):
        self._guest(key).put(path, bytes(data))

    @translated
    def guest_get_file(self, key, path, limit):
        return self._guest(key).get(path, limit)

    @translated
    def guest_glob(self, key, directory, patterns):
        return self._guest(key).glob(directory, list(patterns))

    @translated
    def address(self, key):
        vm = self._vm(key)
        if self._state(vm) != VMState.RUNNING:
            return None
        guest = self._props(vm, ["guest.ipAddress", "guest.net"])
        ip = guest.get("guest.ipAddress")
        if ip and ":" not in ip:
            return ip
        for nic in guest.get("guest.net") or []:
            for ip in nic.ipAddress or []:
                if ":" not in ip and not ip.startswith("127."):
                    return ip
        return None

    @translated
    def state(self, key):
        base.check_key(key)
        vm = self._find(key)
        if vm is None:
            return VMState.ABSENT
        props = self._props(vm, ["config.template", "runtime.powerState"])
        if props.get("config.template"):
            return VMState.ERROR
        return POWER_STATES.get(str(props.get("runtime.powerState")), VMState.ERROR)


def _seed(key, guest):
    try:
        return guestinfo.values(guest)
    except SeedError as exc:
        raise Invalid(f"{key}: cannot build the guest's seed: {exc}") from None


def _options(values):
    return [vim.option.OptionValue(key=k, value=v) for k, v in values.items()]


def _vm_info(props, host_name):
    name = props["name"]
    state = POWER_STATES.get(str(props.get("runtime.powerState")), VMState.ERROR)
    return VMInfo(
        name,
        state,
        host_name,
        props.get("summary.config.numCpu") or 0,
        props.get("summary.config.memorySizeMB") or 0,
        base.is_managed(name),
    )
