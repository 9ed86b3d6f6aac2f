"""``manage.py vm …``: VMs from the command line. Actions submit jobs (``--wait`` follows them).

vm list [--user NAME] [--state S] [--json]
vm info ID [--json]
vm create IMAGE --user NAME [--vcpus N] [--memory-mib N] [--disk-gib N] [--name NAME] [--wait]
vm start|stop|suspend|resume|destroy ID [--wait]
vm migrate ID [--to HYPERVISOR] [--wait]
vm capture ID IMAGE_NAME [--force] [--wait]
vm resize ID [--vcpus N] [--memory-mib N] [--wait]
"""

import json
import time

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from core.changelog import Actor
from inventory.models import Hypervisor
from jobs.models import Job
from provisioning import resizing, services
from provisioning.api.serializers import VMSerializer
from provisioning.models import VM, Image

CLI = Actor(name="cli")
ACTIONS = ("start", "stop", "suspend", "resume", "destroy", "migrate", "capture")


class Command(BaseCommand):
    help = "List, inspect, create and act on VMs (actions run as jobs)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True)
        listing = sub.add_parser("list")
        listing.add_argument("--user")
        listing.add_argument("--state", choices=VM.State.values)
        listing.add_argument("--json", action="store_true")
        info = sub.add_parser("info")
        info.add_argument("id", type=int)
        info.add_argument("--json", action="store_true")
        create = sub.add_parser("create")
        create.add_argument("image", help="image name")
        create.add_argument("--user", required=True, help="owner")
        create.add_argument("--name", default="")
        for size in ("vcpus", "memory-mib", "disk-gib"):
            create.add_argument(f"--{size}", type=int)
        create.add_argument("--wait", action="store_true")
        resize = sub.add_parser("resize", help="change its vCPUs and memory (its claim first; see the job's 'applies')")
        resize.add_argument("id", type=int)
        resize.add_argument("--vcpus", type=int)
        resize.add_argument("--memory-mib", type=int)
        resize.add_argument("--wait", action="store_true")
        for verb in ACTIONS:
            act = sub.add_parser(verb)
            act.add_argument("id", type=int)
            act.add_argument("--wait", action="store_true")
            if verb == "migrate":
                act.add_argument("--to", help="target hypervisor name (default: the best other host)")
            if verb == "capture":
                act.add_argument("image_name", help="name of the new image")
                act.add_argument("--force", action="store_true", help="power off instead of a guest shutdown")

    def handle(self, *args, verb, **options):
        if verb == "list":
            return self.list(options)
        if verb == "info":
            vm = self.vm(options["id"])
            data = VMSerializer(vm).data
            self.stdout.write(
                json.dumps(data, indent=2, default=str)
                if options["json"]
                else "\n".join(f"{key}: {value}" for key, value in data.items())
            )
            return
        try:
            if verb == "create":
                job = self.create(options)
            elif verb == "resize":
                size = {"vcpus": options["vcpus"], "memory_mib": options["memory_mib"]}
                job = resizing.resize(self.vm(options["id"]), actor=CLI, reason="cli: resize", **size)
            else:
                params = {}
                if verb == "migrate" and options.get("to"):
                    target = Hypervisor.objects.filter(name__iexact=options["to"]).first()
                    if target is None:
                        raise CommandError(f"no hypervisor named {options['to']!r}")
                    params["target"] = target.pk
                if verb == "capture":
                    params.update(image_name=options["image_name"], force=options["force"])
                job = services.submit_action(self.vm(options["id"]), verb, actor=CLI, reason=f"cli: {verb}", **params)
        except ValidationError as exc:
            raise CommandError("\n".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from None
        except services.Conflict as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"job {job.pk} submitted")
        if options.get("wait"):
            job = self.wait(job)
            if verb == "resize" and job.result.get("applies"):
                self.stdout.write(f"the new size applies: {job.result['applies']}")

    def list(self, options):
        vms = VM.objects.select_related("owner", "host", "image").order_by("id")
        if options["user"]:
            vms = vms.filter(owner__username=options["user"])
        if options["state"]:
            vms = vms.filter(state=options["state"])
        if options["json"]:
            self.stdout.write(json.dumps(VMSerializer(vms, many=True).data, indent=2, default=str))
            return
        for vm in vms:
            owner = vm.owner.username if vm.owner else "-"
            self.stdout.write(
                f"{vm.pk:>6} {vm.key:<12} {vm.state:<10} {vm.image.name:<24} {owner:<16} "
                f"{vm.host.name if vm.host else '-':<16} {vm.address or '-'}"
            )

    def vm(self, vm_id):
        vm = VM.objects.filter(pk=vm_id).select_related("host", "owner").first()
        if vm is None:
            raise CommandError(f"no VM {vm_id}")
        return vm

    def create(self, options):
        owner = get_user_model().objects.filter(username=options["user"]).first()
        if owner is None:
            raise CommandError(f"no user {options['user']!r}")
        image = Image.objects.filter(name=options["image"]).first()
        if image is None:
            raise CommandError(f"no image {options['image']!r}")
        vm, job = services.request_vm(
            actor=CLI,
            owner=owner,
            image=image,
            name=options["name"],
            vcpus=options["vcpus"],
            memory_mib=options["memory_mib"],
            disk_gib=options["disk_gib"],
            reason="cli: create",
        )
        self.stdout.write(f"VM {vm.pk} ({vm.key}) requested")
        return job

    def wait(self, job):
        while not (job := Job.objects.get(pk=job.pk)).is_final:
            time.sleep(0.3)
        if job.status != Job.Status.SUCCESS:
            raise CommandError(f"job {job.pk} {job.status}: {job.error_message}")
        self.stdout.write(f"job {job.pk} success")
        return job
