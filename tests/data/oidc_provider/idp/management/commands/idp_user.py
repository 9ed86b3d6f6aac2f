from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create or update a user; its groups become exactly --groups."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("password")
        parser.add_argument("--email", default="")
        parser.add_argument("--first-name", default="")
        parser.add_argument("--last-name", default="")
        parser.add_argument("--groups", default="")

    def handle(self, username, password, email, first_name, last_name, groups, **options):
        user, _ = User.objects.get_or_create(username=username)
        user.set_password(password)
        user.email, user.first_name, user.last_name = email, first_name, last_name
        user.save()
        user.groups.set([Group.objects.get_or_create(name=n)[0] for n in groups.split(",") if n])
