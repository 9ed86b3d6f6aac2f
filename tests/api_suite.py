"""A generic REST API suite: CRUD and permissions for one model, fed with data per model.

Subclass it in a test module (the subclass name must start with ``Test``)::

    class TestNodeGroupApi(ApiCrudSuite):
        url = "/api/v1/node-groups/"

        def make(self):                      # an existing object to read, change, delete
            return NodeGroup.objects.create(name="g1")

        def create_payload(self):            # a valid body for POST
            return {"name": "g2"}

        def update_payload(self, obj):       # a valid body for PATCH
            return {"description": "changed"}

Personas (fixtures from tests/conftest.py): ``admin_user`` may do everything; ``alice`` (a
plain user) and anonymous clients are refused; an administrator's *read-only* token may read
but every write is refused and changes nothing. Set ``user_can_read = True`` for endpoints
where any signed-in user may read (``IsStaffOrReadOnly``), ``user_can_write = True`` where
plain users may also write, and ``deletable = False`` where DELETE is not offered.
"""

import pytest

OPERATIONS = ["list", "detail", "create", "update", "delete"]
WRITES = ["create", "update", "delete"]


class ApiCrudSuite:
    url = None  # the list URL, e.g. "/api/v1/node-groups/"
    user_can_read = False
    user_can_write = False
    deletable = True
    write_only_fields = ()  # sent on create but never returned (e.g. secrets)

    # --- data, supplied per model -------------------------------------------------------

    def make(self):
        raise NotImplementedError

    def create_payload(self):
        raise NotImplementedError

    def update_payload(self, obj):
        raise NotImplementedError

    # --- overridable helpers -------------------------------------------------------------

    def invalid_payload(self):
        """A body the create endpoint must refuse with 400."""
        return {"name": ["not", "a", "string"]}

    def detail_url(self, obj):
        return f"{self.url}{obj.pk}/"

    def snapshot(self, obj):
        """The object's stored row, to prove a refused write changed nothing."""
        return type(obj).objects.filter(pk=obj.pk).values().first()

    def assert_matches(self, data, payload):
        for key, value in payload.items():
            if key in self.write_only_fields:
                assert key not in data, f"{key} must never be returned"
            else:
                assert data[key] == value, f"{key}: {data[key]!r} != {value!r}"

    def call(self, client, operation, obj):
        if operation == "list":
            return client.get(self.url)
        if operation == "detail":
            return client.get(self.detail_url(obj))
        if operation == "create":
            return client.post(self.url, self.create_payload(), format="json")
        if operation == "update":
            return client.patch(self.detail_url(obj), self.update_payload(obj), format="json")
        return client.delete(self.detail_url(obj))

    @staticmethod
    def assert_error_format(response, status):
        assert response.status_code == status, response.content[:500]
        error = response.json()["error"]
        assert error["status"] == status and error["message"]

    # --- the suite ---------------------------------------------------------------------

    def test_admin_lists(self, db, api, admin_user):
        obj = self.make()
        response = api(admin_user).get(self.url)
        assert response.status_code == 200, response.content[:500]
        body = response.json()
        rows = body["results"] if isinstance(body, dict) and "results" in body else body
        assert obj.pk in [row["id"] for row in rows]

    def test_admin_reads_one(self, db, api, admin_user):
        obj = self.make()
        response = api(admin_user).get(self.detail_url(obj))
        assert response.status_code == 200, response.content[:500]
        assert response.json()["id"] == obj.pk

    def test_admin_creates(self, db, api, admin_user):
        self.make()
        payload = self.create_payload()
        response = api(admin_user).post(self.url, payload, format="json")
        assert response.status_code == 201, response.content[:500]
        self.assert_matches(response.json(), payload)
        detail = api(admin_user).get(f"{self.url}{response.json()['id']}/")
        self.assert_matches(detail.json(), payload)

    def test_admin_updates(self, db, api, admin_user):
        obj = self.make()
        payload = self.update_payload(obj)
        response = api(admin_user).patch(self.detail_url(obj), payload, format="json")
        assert response.status_code == 200, response.content[:500]
        self.assert_matches(response.json(), payload)

    def test_admin_deletes(self, db, api, admin_user):
        if not self.deletable:
            pytest.skip("DELETE is not offered")
        obj = self.make()
        response = api(admin_user).delete(self.detail_url(obj))
        assert response.status_code == 204, response.content[:500]
        assert self.snapshot(obj) is None

    def test_admin_gets_404_for_a_missing_object(self, db, api, admin_user):
        response = api(admin_user).get(f"{self.url}999999999/")
        self.assert_error_format(response, 404)

    def test_admin_gets_a_clear_400_for_an_invalid_body(self, db, api, admin_user):
        response = api(admin_user).post(self.url, self.invalid_payload(), format="json")
        self.assert_error_format(response, 400)

    @pytest.mark.parametrize("operation", OPERATIONS)
    def test_plain_user(self, db, api, alice, operation):
        obj = self.make()
        before = self.snapshot(obj)
        response = self.call(api(alice), operation, obj)
        allowed = self.user_can_write if operation in WRITES else self.user_can_read
        if allowed:
            assert response.status_code < 400, response.content[:500]
        else:
            self.assert_error_format(response, 403)
            assert self.snapshot(obj) == before

    @pytest.mark.parametrize("operation", OPERATIONS)
    def test_anonymous_is_refused(self, db, api, operation):
        obj = self.make()
        before = self.snapshot(obj)
        count = type(obj).objects.count()
        response = self.call(api(None), operation, obj)
        self.assert_error_format(response, 401)
        assert self.snapshot(obj) == before and type(obj).objects.count() == count

    @pytest.mark.parametrize("operation", ["list", "detail"])
    def test_read_only_token_reads(self, db, api, admin_user, operation):
        obj = self.make()
        response = self.call(api(admin_user, write=False), operation, obj)
        assert response.status_code == 200, response.content[:500]

    @pytest.mark.parametrize("operation", WRITES)
    def test_read_only_token_cannot_write(self, db, api, admin_user, operation):
        obj = self.make()
        before = self.snapshot(obj)
        count = type(obj).objects.count()
        response = self.call(api(admin_user, write=False), operation, obj)
        self.assert_error_format(response, 403)
        assert self.snapshot(obj) == before and type(obj).objects.count() == count
