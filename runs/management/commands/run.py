"""``manage.py run``: run a command in a fresh VM of a platform, stream its output, exit with
its exit status — for a CI system's shell step (GitLab's custom executor, Jenkins, Buildbot).

    manage.py run --platform debian-12 --timeout 10m [--artifact 'out/*.xml'] [--input FILE[=PATH]]
                  [--env NAME=VALUE] [--image NAME] [--user NAME] [--artifacts-dir DIR] -- make test

The output is written to stdout as the command prints it (bytes as they are); the vclmgr's own
notes go to stderr. Artifacts are saved under ``--artifacts-dir`` (default: here) at their
paths. Exit status: the command's; 124 when it ran past its time limit; 130 when canceled
(Ctrl-C or SIGTERM cancel the run and wait for its VM to be destroyed); 125 when vclmgr could
not run it (refused, no VM); the refusal is on stderr. Workers must be running (``make run``,
``qcluster``): this command only submits and reads.
"""

import os
import signal
import time
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from core.changelog import Actor
from provisioning.models import Image
from runs import services, validation
from runs.models import Run, RunFile

EXIT_TIME_LIMIT, EXIT_CANCELED, EXIT_VCLMGR = 124, 130, 125
POLL = 0.2


def key_value(text):
    name, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"{text!r}: expected NAME=VALUE")
    return name, value


class Command(BaseCommand):
    help = "Run a command in a fresh VM of a platform; stream its output; exit with its exit status."

    def add_arguments(self, parser):
        where = parser.add_mutually_exclusive_group(required=True)
        where.add_argument("--platform", help="os[/arch] as images declare them, e.g. debian-12")
        where.add_argument("--image", help="an image name")
        parser.add_argument("--timeout", default=None, help="time limit: 90s, 10m, 1h30m (default RUN_DEFAULT_SECONDS)")
        parser.add_argument("--artifact", action="append", default=[], help="pattern under the work directory")
        parser.add_argument("--input", action="append", default=[], help="FILE or FILE=PATH in the work directory")
        parser.add_argument("--env", action="append", default=[], type=key_value, help="NAME=VALUE")
        parser.add_argument("--script", help="a file with a shell script to run instead of a command")
        parser.add_argument("--priority", default="batch", choices=list(services.JOB_PRIORITY))
        parser.add_argument("--keep-failed", default=None, help="keep a failed run's VM stopped this long: 30m, 2h")
        parser.add_argument("--capture-failed", action="store_true", help="capture a failed run's VM as your image")
        parser.add_argument("--user", default=os.environ.get("VCLMGR_RUN_USER"), help="default $VCLMGR_RUN_USER")
        parser.add_argument("--artifacts-dir", default=".", help="where artifacts are saved (default: here)")
        parser.add_argument("command", nargs="*", help="the command (after --)")

    def handle(self, *args, **opts):
        if not opts["user"]:
            raise CommandError("--user NAME (or VCLMGR_RUN_USER) names whose run it is")
        user = get_user_model().objects.filter(username=opts["user"], is_active=True).first()
        if user is None:
            raise CommandError(f"no active user {opts['user']!r}")
        run = self.submit(user, opts)
        self.stderr.write(f"vclmgr: run {run.pk} queued ({run.image.name})")
        code = self.follow(run, user)
        run = Run.objects.select_related("vm").get(pk=run.pk)
        if services.kept_vm(run):
            until = f"{run.kept_until:%Y-%m-%d %H:%M} UTC"
            self.stderr.write(
                f"vclmgr: its VM {run.vm.key} is kept stopped for inspection until {until} "
                f"(POST /api/v1/runs/{run.pk}/discard/ ends it)"
            )
        self.save_artifacts(run, Path(opts["artifacts_dir"]))
        raise SystemExit(code)

    def submit(self, user, opts):
        try:
            timeout = validation.parse_duration(opts["timeout"]) if opts["timeout"] else None
            keep = validation.parse_duration(opts["keep_failed"]) if opts["keep_failed"] else 0
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        inputs = []
        for item in opts["input"]:
            local, _, path = item.partition("=")
            try:
                inputs.append((path or Path(local).name, Path(local).read_bytes()))
            except OSError as exc:
                raise CommandError(f"--input {local}: {exc.strerror}") from None
        image = None
        if opts["image"]:
            image = Image.objects.filter(name=opts["image"]).first()
            if image is None:
                raise CommandError(f"no image {opts['image']!r}")
        script = Path(opts["script"]).read_text() if opts["script"] else ""
        try:
            return services.submit(
                actor=Actor(name=f"cli:{user.username}", user=user),
                owner=user,
                platform=opts["platform"] or "",
                image=image,
                argv=opts["command"],
                script=script,
                env=dict(opts["env"]),
                artifacts=opts["artifact"],
                inputs=inputs,
                time_limit=timeout,
                priority=opts["priority"],
                keep_failed_minutes=-(-keep // 60),
                capture_failed=opts["capture_failed"],
                reason="manage.py run",
            )
        except ValidationError as exc:
            text = "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
            self.stderr.write(f"vclmgr: refused: {text}")
            raise SystemExit(EXIT_VCLMGR) from None

    def follow(self, run, user):
        """Stream the output until the run ends; a signal cancels it (once) and keeps following."""
        asked = []

        def cancel(signum, frame):
            if not asked:
                asked.append(signum)
                self.stderr.write(f"vclmgr: canceling run {run.pk}")
                try:
                    services.cancel(Run.objects.get(pk=run.pk), actor=user, reason="manage.py run interrupted")
                except Exception as exc:  # noqa: BLE001 (it may have just ended)
                    self.stderr.write(f"vclmgr: {exc}")

        old = {s: signal.signal(s, cancel) for s in (signal.SIGINT, signal.SIGTERM)}
        after, out = -1, self.stdout._out.buffer if hasattr(self.stdout._out, "buffer") else None
        try:
            while True:
                current = Run.objects.get(pk=run.pk)
                chunks, after = services.log(current, after, 500)
                for chunk in chunks:
                    self.emit(bytes(chunk.data), out)
                if current.is_final and not chunks:
                    break
                if not chunks:
                    time.sleep(POLL)
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
        note = services.truncation_note(current)
        if note:
            self.stderr.write(f"vclmgr: {note}")
        self.stderr.write(f"vclmgr: run {run.pk} {current.state}" + (f": {current.error}" if current.error else ""))
        if current.state == Run.State.CANCELED:
            return EXIT_CANCELED
        if current.exit_status is not None:
            return current.exit_status if 0 <= current.exit_status < 256 else 1
        return EXIT_TIME_LIMIT if current.error.startswith("killed: past its time limit") else EXIT_VCLMGR

    def emit(self, data, out):
        if out is not None:
            out.write(data)
            out.flush()
        else:  # a test's StringIO
            self.stdout.write(data.decode("utf-8", "replace"), ending="")

    def save_artifacts(self, run, directory):
        for item in run.files.filter(kind=RunFile.Kind.ARTIFACT):
            target = directory / validation.artifact_path(item.path)  # checked again: it names a local file
            target.parent.mkdir(parents=True, exist_ok=True)
            with services.storage().open(item.stored, "rb") as src:
                target.write_bytes(src.read())
            self.stderr.write(f"vclmgr: artifact {item.path} ({item.size} bytes)")
