"""ASGI entry point: HTTP (Django), websockets (channels). Run with
``daphne vclmgr.asgi:application`` or ``manage.py serve``."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vclmgr.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from accounts.api.authentication import TokenWebsocketMiddleware  # noqa: E402
from vclmgr.routing import websocket_urlpatterns  # noqa: E402

_sockets = URLRouter(websocket_urlpatterns)
application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": TokenWebsocketMiddleware(
            token_app=_sockets, cookie_app=AllowedHostsOriginValidator(AuthMiddlewareStack(_sockets))
        ),
    }
)
