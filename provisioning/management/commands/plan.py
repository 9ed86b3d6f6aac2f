"""``manage.py plan …``: move plans (dry runs stored as Plan rows) and their execution as jobs.

    plan list
    plan show ID [--json]
    plan balance [-G GROUP] [--max-moves N] [-X] [--reason R]      (hbal -L [-X])
    plan squeeze [-G GROUP] [-X] [--target-resources N] [--minimal-resources N] [--reason R]
                                                                     (hsqueeze [-X])
    plan evacuate-node NAME [--dry-run] [--reason rate-limit:N:…]    (gnt-node evacuate)
    plan evacuate-group NAME [--dry-run] [--reason rate-limit:N:…]   (gnt-group evacuate)
    plan execute ID [--recompute] [--wait]
    plan cancel ID

``hbal -X``, ``hsqueeze -X``, ``node evacuate`` and ``group evacuate`` call this command.
Balance and squeeze compute only unless ``-X``; evacuations execute unless ``--dry-run``
(as Ganeti's). Exit status 1 with the reason when refused (stale, executed already, …).
"""

import json
import time

from django.core.management.base import BaseCommand, CommandError

from core.changelog import Actor
from core.errors import Conflict
from jobs.models import Job
from provisioning import plans
from provisioning.api.plans import PlanSerializer
from provisioning.models import Plan

CLI = Actor(name="cli")
KINDS = {"balance": "balance", "squeeze": "squeeze", "evacuate-node": "evacuate-node",
         "evacuate-group": "evacuate-group"}  # fmt: skip
SQUEEZE_OPTIONS = ("target_resources", "minimal_resources")


class Command(BaseCommand):
    help = "Compute, show, execute and cancel move plans (hbal, hsqueeze, evacuations)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True)
        sub.add_parser("list")
        show = sub.add_parser("show")
        show.add_argument("id", type=int)
        show.add_argument("--json", action="store_true")
        for kind in KINDS:
            make = sub.add_parser(kind)
            if kind.startswith("evacuate"):
                make.add_argument("name")
                make.add_argument("--dry-run", action="store_true", help="compute and show, do not execute")
            else:
                make.add_argument("-G", "--group", help="the node group")
                make.add_argument("-X", "--exec", dest="execute", action="store_true", help="execute the plan")
            if kind == "balance":
                make.add_argument("--max-moves", type=int, default=-1)
            if kind == "squeeze":
                make.add_argument(
                    "--target-resources",
                    type=float,
                    help="free capacity to keep, in standard instances per host (default 2)",
                )
                make.add_argument(
                    "--minimal-resources",
                    type=float,
                    help="below this free capacity per host, bring hosts back (default 2)",
                )
            make.add_argument("--reason", default="", help="why; rate-limit:N:label caps concurrent moves at N")
            make.add_argument("--rate-limit", type=int, help="at most N migrations at once (default 4)")
            make.add_argument("--wait", action="store_true", help="wait until the jobs have ended")
            make.add_argument("--json", action="store_true")
        run = sub.add_parser("execute")
        run.add_argument("id", type=int)
        run.add_argument("--recompute", action="store_true", help="recompute a stale plan instead of refusing")
        run.add_argument("--wait", action="store_true")
        stop = sub.add_parser("cancel")
        stop.add_argument("id", type=int)

    def handle(self, *args, verb, **opts):
        try:
            if verb == "list":
                return self.list()
            if verb in KINDS:
                return self.make(KINDS[verb], opts)
            plan = Plan.objects.filter(pk=opts["id"]).first()
            if plan is None:
                raise CommandError(f"no plan {opts['id']}")
            if verb == "show":
                return self.show(plans.refresh(plan), opts.get("json"))
            if verb == "execute":
                plan = plans.execute(plan, actor=CLI, recompute=opts["recompute"])
                return self.after(plan, opts)
            plan = plans.cancel(plan, actor=CLI)
            self.stdout.write(f"plan {plan.pk}: canceled")
        except Conflict as exc:
            raise CommandError(str(exc)) from None

    def list(self):
        line = "{:>5} {:<15} {:<10} {:<16} {:>6} {:>12} {:>12}"
        self.stdout.write(line.format("ID", "Kind", "State", "Target", "Moves", "Score", "After"))
        for p in Plan.objects.all()[:100]:
            self.stdout.write(
                line.format(
                    p.pk,
                    p.kind,
                    p.state,
                    p.target[:16],
                    len(p.moves),
                    f"{p.score_before or 0:.8f}",
                    f"{p.score_after or 0:.8f}",
                )
            )

    def make(self, kind, opts):
        options = {"max_moves": opts["max_moves"]} if opts.get("max_moves", -1) != -1 else {}
        options.update({key: opts[key] for key in SQUEEZE_OPTIONS if opts.get(key) is not None})
        plan = plans.compute(
            kind,
            actor=CLI,
            target=opts.get("name", ""),
            group=opts.get("group"),
            reason=opts["reason"],
            rate_limit=opts["rate_limit"],
            options=options,
        )
        run = opts.get("execute") or (kind.startswith("evacuate") and not opts.get("dry_run"))
        if not run:
            return self.show(plan, opts["json"])
        self.show(plan, opts["json"])
        self.after(plans.execute(plan, actor=CLI), opts)

    def show(self, plan, as_json=False):
        if as_json:
            self.stdout.write(json.dumps(PlanSerializer(plan).data, indent=2, default=str))
            return
        self.stdout.write(f"Plan {plan.pk} ({plan.kind} {plan.target}, {plan.state})")
        self.stdout.write(f"Initial score: {plan.score_before:.8f}")
        for m in plan.moves:
            after = f" after {','.join(str(d + 1) for d in m['depends'])}" if m["depends"] else ""
            job = f" job {m['job']} {m['status']}" if m["job"] else ""
            self.stdout.write(f"{m['index'] + 1:4d}. {m['name']} {m['from']} => {m['to']}{after}{job}")
        self.stdout.write(f"Cluster score improved from {plan.score_before:.8f} to {plan.score_after:.8f}")
        self.stdout.write(f"Solution length={len(plan.moves)}")
        if plan.power_off:
            self.stdout.write(f"Power off: {', '.join(plan.power_off)}")
        if plan.power_on:
            self.stdout.write(f"Bring back online: {', '.join(plan.power_on)}")
        for note in plan.notes:
            self.stdout.write(f"Note: {note}")

    def after(self, plan, opts):
        self.stdout.write(
            f"plan {plan.pk}: {plan.state}, {sum(1 for m in plan.moves if m['job'])} jobs under {plan.bucket}"
        )
        if not opts.get("wait"):
            return
        # The moves and the plan's other jobs (power, re-placing): the plan ends with the last.
        ids = [m["job"] for m in plan.moves if m["job"]] + [j["job"] for j in plan.jobs]
        while Job.objects.filter(pk__in=ids).exclude(status__in=Job.FINAL).exists():
            time.sleep(0.2)
        plan = plans.refresh(plan)
        self.stdout.write(f"plan {plan.pk}: {plan.state}")
        if plan.state != Plan.State.DONE:
            raise CommandError(f"plan {plan.pk} ended {plan.state}")
