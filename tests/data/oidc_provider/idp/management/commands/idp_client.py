from django.core.management.base import BaseCommand
from oauth2_provider.models import Application


class Command(BaseCommand):
    help = "Register a confidential OpenID client (RS256, no consent page)."

    def add_arguments(self, parser):
        parser.add_argument("client_id")
        parser.add_argument("secret")
        parser.add_argument("redirect_uri")

    def handle(self, client_id, secret, redirect_uri, **options):
        Application.objects.update_or_create(
            client_id=client_id,
            defaults={
                "name": client_id,
                "client_secret": secret,
                "client_type": Application.CLIENT_CONFIDENTIAL,
                "authorization_grant_type": Application.GRANT_AUTHORIZATION_CODE,
                "redirect_uris": redirect_uri,
                "algorithm": Application.RS256_ALGORITHM,
                "skip_authorization": True,
                "hash_client_secret": True,
            },
        )
