"""``manage.py revision template|publish|discard|test``: an image's template from the command
line. The ``revision`` command is provisioning's; these verbs are registered into it
(``VERBS``) at start-up, as they act on reservations (``reservations.templates``).

revision template IMAGE --as USER [--revision N] [--ssh-key FILE]   # start the image's template
revision publish IMAGE --as USER [--production] [--comment TEXT] [--keep]
revision discard IMAGE --as USER
revision test IMAGE N --as USER [--duration MINUTES]               # reserve revision N to try it
"""

from datetime import timedelta
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from reservations import services


def _as(parser):
    parser.add_argument("--as", dest="as_user", required=True, metavar="USER", help="the image maintainer who acts")


def _user(options):
    user = get_user_model().objects.filter(username=options["as_user"]).first()
    if user is None:
        raise CommandError(f"no user named {options['as_user']!r}")
    return user


def _template(image):
    template = services.open_template(image)
    if template is None:
        raise CommandError(f"{image.name} has no template: start one with 'revision template'")
    return template


def template_arguments(parser):
    _as(parser)
    parser.add_argument("--revision", type=int, help="start from this revision (default: production)")
    parser.add_argument("--ssh-key", help="a file with the public key to log in with")


def start(command, image, options):
    revision = command.revision(image, options["revision"]) if options["revision"] else None
    key = Path(options["ssh_key"]).read_text() if options["ssh_key"] else ""
    template = services.start_template(image, revision=revision, ssh_key=key, actor=_user(options))
    return f"{image.name}: template started (reservation {template.pk}, from revision {template.revision.number})"


def publish_arguments(parser):
    _as(parser)
    parser.add_argument("--production", action="store_true", help="production at once (default: testing)")
    parser.add_argument("--comment", default="", help="what changed")
    parser.add_argument("--keep", action="store_true", help="keep the template for the next round")


def publish(command, image, options):
    job = services.publish(
        _template(image),
        production=options["production"],
        comment=options["comment"],
        keep=options["keep"],
        actor=_user(options),
    )
    state = "production" if options["production"] else "testing"
    return f"{image.name}: publishing the template as a new {state} revision (capture job {job.pk})"


def discard(command, image, options):
    template = _template(image)
    services.discard(template, actor=_user(options))
    return f"{image.name}: template discarded (reservation {template.pk} ends)"


def test_arguments(parser):
    parser.add_argument("number", type=int)
    _as(parser)
    parser.add_argument("--duration", type=int, default=60, help="minutes (default: 60)")


def test(command, image, options):
    revision = command.revision(image, options["number"])
    reservation = services.test_revision(
        image, revision, duration=timedelta(minutes=options["duration"]), actor=_user(options)
    )
    return f"{image.name}: revision {revision.number} reserved to test (reservation {reservation.pk})"


# verb -> (help, its arguments besides IMAGE, what it does: (command, image, options) -> a line)
VERBS = {
    "template": ("start the image's template (a long-lived VM to change)", template_arguments, start),
    "publish": ("capture the template as the image's next revision", publish_arguments, publish),
    "discard": ("end the template without a revision", _as, discard),
    "test": ("reserve a revision to try it as a student would", test_arguments, test),
}
