"""No browser or proxy keeps a copy of what vclmgr answers a signed-in user, or of any API answer.

Those answers carry one-time passwords, newly issued API tokens, connection details and other
per-user data; ``Cache-Control: no-store`` (with Django's other never-cache headers) keeps them
out of shared caches and the browser's back-button store. A view that sets its own
``Cache-Control`` keeps it. Static files never reach this (whitenoise answers them earlier).
"""

from django.utils.cache import add_never_cache_headers


class NoStoreMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        personal = request.path.startswith("/api/") or request.user.is_authenticated
        if personal and not response.has_header("Cache-Control"):
            add_never_cache_headers(response)
        return response
