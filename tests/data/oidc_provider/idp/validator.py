"""Claims of the test provider: names, e-mail and a ``groups`` claim; misbehaving users."""

import time

from oauth2_provider.oauth2_validators import OAuth2Validator

TAMPERED = {
    "mallory-aud": {"aud": "another-client"},
    "mallory-nonce": {"nonce": "not-the-one-asked-for"},
    "mallory-sub": {"sub": "1"},  # the ID token names someone else than the userinfo answer
    "mallory-iss": {"iss": "https://another-issuer.example/o"},  # signed with this provider's key
}


class Validator(OAuth2Validator):
    # Every claim in every answer: the scopes only decide what vclmgr asks for.
    oidc_claim_scope = None

    def get_additional_claims(self, request):
        user = request.user
        groups = sorted(user.groups.values_list("name", flat=True))
        return {
            "preferred_username": user.username,
            "email": user.email,
            "email_verified": "unverified-email" not in groups,
            "given_name": user.first_name,
            "family_name": user.last_name,
            "groups": groups,
        }

    def get_id_token_dictionary(self, token, token_handler, request):
        claims, expiration = super().get_id_token_dictionary(token, token_handler, request)
        claims.update(TAMPERED.get(request.user.username, {}))
        if request.user.username == "mallory-exp":
            claims["exp"] = int(time.time()) - 3600  # expired an hour ago (signed, fresh from the token endpoint)
        return claims, expiration
