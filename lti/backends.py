"""The sign-in backend of LTI launches' sessions (in ``AUTHENTICATION_BACKENDS``).

A launch is not a password: ``lti.views.launch`` signs the user in after ``lti.services.launch``
accepted the platform's signed ID token, naming this backend, so the session's user is read
back by it whatever the local-login rule (``LOCAL_LOGIN_STAFF_ONLY`` refuses non-staff in
``get_user`` too). It authenticates nobody by itself."""

from accounts.signon import LocalBackend


class LaunchBackend(LocalBackend):
    def authenticate(self, request, **credentials):
        return None
