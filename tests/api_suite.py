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

Roles (``accounts.access``): every role is tried on every operation with a token carrying every
scope the role allows; ``role_reads`` / ``role_writes`` name the roles besides admin that may
read / write (e.g. ``("operator", "auditor")`` and ``("operator",)`` for the inventory).
"""

import pytest

from accounts import access

OPERATIONS = ["list", "detail", "create", "update", "delete"]
WRITES = ["create", "update", "delete"]
SUCCESS = {"list": 200, "detail": 200, "create": 201, "update": 200, "delete": 204}


class ApiCrudSuite:
    url = None  # the list URL, e.g. "/api/v1/node-groups/"
    user_can_read = False
    user_can_write = False
    deletable = True
    write_only_fields = ()  # sent on create but never returned (e.g. secrets)
    role_reads = ()  # roles (besides admin) that may read
    role_writes = ()  # roles (besides admin) that may write

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

    def assert_done(self, operation, response, obj, before, count):
        """The operation answered its success status and did what it says (``before``, ``count``:
        the object's row and the number of rows before it)."""
        assert response.status_code == SUCCESS[operation], response.content[:500]
        model = type(obj)
        if operation == "list":
            body = response.json()
            rows = body["results"] if isinstance(body, dict) and "results" in body else body
            assert obj.pk in [row["id"] for row in rows]
        elif operation == "detail":
            assert response.json()["id"] == obj.pk
        elif operation == "create":
            self.assert_matches(response.json(), self.create_payload())
            assert model.objects.count() == count + 1 and model.objects.filter(pk=response.json()["id"]).exists()
        elif operation == "update":
            self.assert_matches(response.json(), self.update_payload(obj))
            assert self.snapshot(obj) != before, "the update changed nothing"
        else:
            assert self.snapshot(obj) is None and model.objects.count() == count - 1

    def run_operation(self, client, operation):
        """``(response, obj, its row before, the row count before)`` of one operation on a fresh object."""
        obj = self.make()
        before, count = self.snapshot(obj), type(obj).objects.count()
        return self.call(client, operation, obj), obj, before, count

    @staticmethod
    def assert_error_format(response, status):
        assert response.status_code == status, response.content[:500]
        error = response.json()["error"]
        assert error["status"] == status and error["message"]

    # --- the suite ---------------------------------------------------------------------

    def test_admin_lists(self, db, api, admin_user):
        self.assert_done("list", *self.run_operation(api(admin_user), "list"))

    def test_admin_reads_one(self, db, api, admin_user):
        self.assert_done("detail", *self.run_operation(api(admin_user), "detail"))

    def test_admin_creates(self, db, api, admin_user):
        response, obj, before, count = self.run_operation(api(admin_user), "create")
        self.assert_done("create", response, obj, before, count)
        detail = api(admin_user).get(f"{self.url}{response.json()['id']}/")
        self.assert_matches(detail.json(), self.create_payload())

    def test_admin_updates(self, db, api, admin_user):
        self.assert_done("update", *self.run_operation(api(admin_user), "update"))

    def test_admin_deletes(self, db, api, admin_user):
        if not self.deletable:
            pytest.skip("DELETE is not offered")
        self.assert_done("delete", *self.run_operation(api(admin_user), "delete"))

    def test_admin_gets_404_for_a_missing_object(self, db, api, admin_user):
        response = api(admin_user).get(f"{self.url}999999999/")
        self.assert_error_format(response, 404)

    def test_admin_gets_a_clear_400_for_an_invalid_body(self, db, api, admin_user):
        response = api(admin_user).post(self.url, self.invalid_payload(), format="json")
        self.assert_error_format(response, 400)

    def assert_outcome(self, allowed, operation, response, obj, before, count):
        """Done if ``allowed`` (405 for a delete the model has not), else 403 and nothing changed."""
        if allowed and operation == "delete" and not self.deletable:
            assert response.status_code == 405, response.content[:500]
        elif allowed:
            self.assert_done(operation, response, obj, before, count)
        else:
            self.assert_error_format(response, 403)
            assert self.snapshot(obj) == before and type(obj).objects.count() == count

    @pytest.mark.parametrize("operation", OPERATIONS)
    def test_plain_user(self, db, api, alice, operation):
        response, obj, before, count = self.run_operation(api(alice), operation)
        allowed = self.user_can_write if operation in WRITES else self.user_can_read
        self.assert_outcome(allowed, operation, response, obj, before, count)

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

    @pytest.mark.parametrize("operation", OPERATIONS)
    @pytest.mark.parametrize("role", list(access.ROLES))
    def test_each_role(self, db, api, django_user_model, role, operation):
        user = django_user_model.objects.create_user(f"as-{role}")
        access.set_roles(user, [role], actor="test")
        response, obj, before, count = self.run_operation(api(user), operation)
        allowed = role in (self.role_writes if operation in WRITES else self.role_reads) or (
            operation not in WRITES and self.user_can_read
        )
        self.assert_outcome(allowed, operation, response, obj, before, count)
