"""What a BMC connection may send, and where: a credential only to an origin it was saved for and
only over https:// unless the host allows http://; no internal address unless allow-listed; an
odd answer is the BMC's fault (502), never ours (500).

The "BMC" an operator points a host at is the test's own listener on 127.0.0.1, recording what
it is sent; the real one is sushy-emulator."""

import base64
import json

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from accounts import access
from inventory import power, services
from inventory.models import BladeCenter, Credential, Hypervisor
from tests import redfish
from tests.inventory.conftest import TEST
from tests.listeners import Handler, Listeners

SECRET = "s3cret-bmc-pass"  # noqa: S105 (a test credential)
ROOT = {
    "@odata.id": "/redfish/v1/",
    "Id": "RootService",
    "Name": "Root",
    "Systems": {"@odata.id": "/redfish/v1/Systems"},
    "RedfishVersion": "1.6.0",
}


@pytest.fixture(autouse=True)
def _short_timeout(settings):
    settings.VCLMGR_BMC_TIMEOUT = 2


@pytest.fixture
def operator(django_user_model):
    user = django_user_model.objects.create_user("olga")
    access.set_roles(user, ["operator"], actor="test")
    return user


class _Listener(Handler):
    """Answers a GET with ``server.status`` and ``server.body`` (the Redfish root with 200 when
    ``server.root``: sushy reads it before it logs in); keeps the headers it got."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.server.requests.append(dict(self.headers))
        root = self.server.root and self.path.rstrip("/") == "/redfish/v1"
        body = (json.dumps(ROOT) if root else self.server.body).encode()
        self.answer(200 if root else self.server.status, body, {"Content-Type": "application/json"})


@pytest.fixture
def listener(settings):
    """``listener(status=401, body="[]", root=False)``: a plain-HTTP listener on 127.0.0.1 (allow-listed)."""
    settings.VCLMGR_OUTBOUND_ALLOW = ["127.0.0.1"]
    listeners = Listeners()

    def start(status=200, body='{"@odata.id": "/redfish/v1/"}', root=False):
        return listeners.start(_Listener, requests=[], status=status, body=body, root=root)

    yield start
    listeners.stop()


def sent_the_secret(server):
    secret = base64.b64encode(f"{redfish.USERNAME}:{redfish.PASSWORD}".encode()).decode()
    return any(secret in headers.get("Authorization", "") for headers in server.requests)


def test_an_operator_cannot_make_a_saved_credential_go_to_their_listener(
    api, operator, make_host, redfish_bmc, bmc_host, listener
):
    emulator, stolen = redfish_bmc({"node-1": "on"}), listener(root=True)
    host = bmc_host(make_host(name="node-1"), emulator, "node-1")
    url = f"/api/v1/hypervisors/{host.pk}/"
    assert api(operator).get(f"{url}power/").status_code == 200  # the credential works where it was saved for
    for address, allow_http in ((stolen.url, False), (stolen.url, True), (stolen.url.replace("http:", "https:"), True)):
        moved = api(operator).patch(url, {"bmc_address": address, "bmc_allow_http": allow_http}, format="json")
        assert moved.status_code == 200, moved.json()
        read = api(operator).get(f"{url}power/")
        assert read.status_code == 502 and "was not saved for" in read.json()["error"]["message"]
    assert stolen.requests == [] and not sent_the_secret(stolen)
    # Saving the credential for the new address takes its secret: the operator who does not know it cannot.
    credential = Credential.objects.get(pk=host.bmc_credential_id)
    body = {"endpoints": [emulator.url, stolen.url]}
    refused = api(operator).patch(f"/api/v1/credentials/{credential.pk}/", body, format="json")
    assert refused.status_code == 400 and "give the secret again" in str(refused.json()["error"]["fields"])
    assert Credential.objects.get(pk=credential.pk).endpoints == [credential.endpoints[0]]


def test_a_credential_goes_over_http_only_where_the_host_allows_it(make_host, listener, settings, db):
    plain = listener(status=401, body='{"error": {"code": "Base.1.0.GeneralError", "message": "no"}}', root=True)
    credential = services.create_credential(
        actor=TEST, name="bmc", username=redfish.USERNAME, secret=redfish.PASSWORD, endpoints=[plain.url]
    )
    host = make_host(name="node-1", bmc_address=plain.url, bmc_credential=credential)
    with pytest.raises(power.PowerError, match="sent over https:// only"):
        power.read_power(host, actor=TEST)
    assert plain.requests == []
    services.update_hypervisor(host, actor=TEST, bmc_allow_http=True)
    with pytest.raises(power.PowerError, match="refused the credential"):
        power.read_power(host, actor=TEST)
    assert sent_the_secret(plain)  # the administrator's choice, for this host only


def test_changing_the_bmc_address_needs_the_credential_saved_again_for_it(make_host, redfish_bmc, bmc_host, db):
    first, second = redfish_bmc({"node-1": "on"}), redfish_bmc({"node-1": "off"})
    host = bmc_host(make_host(name="node-1"), first, "node-1")
    assert power.read_power(host, actor=TEST) == "on"
    host = services.update_hypervisor(host, actor=TEST, bmc_address=second.url, bmc_system=second.systems["node-1"])
    with pytest.raises(power.PowerError, match="was not saved for https://127.0.0.1:"):
        power.read_power(host, actor=TEST)
    credential = host.bmc_credential
    services.update_credential(credential, actor=TEST, secret=redfish.PASSWORD, endpoints=[second.url + "/redfish/v1"])
    assert Credential.objects.get(pk=credential.pk).endpoints == [second.url]  # kept as its origin
    assert power.read_power(Hypervisor.objects.get(pk=host.pk), actor=TEST) == "off"


def test_an_internal_bmc_address_is_refused_before_connecting(api, admin_user, make_host, settings, connects, db):
    settings.VCLMGR_OUTBOUND_ALLOW = []  # the production default
    for address in ("https://169.254.169.254", "https://127.0.0.1:8443", "https://[::ffff:10.0.0.1]", "https://bmc"):
        host = make_host(bmc_address=address)
        read = api(admin_user).get(f"/api/v1/hypervisors/{host.pk}/power/")
        assert read.status_code == 502 and "not allowed" in read.json()["error"]["message"], address
    assert connects == []


def test_a_bmc_answering_401_with_a_body_that_is_no_object_is_a_502(api, admin_user, make_host, listener):
    for body in ("[]", '"denied"', "42", '{"error": "denied"}', '{"error": [1]}'):
        odd = listener(status=401, body=body)
        host = make_host(bmc_address=odd.url)
        read = api(admin_user).get(f"/api/v1/hypervisors/{host.pk}/power/")
        assert read.status_code == 502, (body, read.content)
        assert read.json()["error"]["code"] == "upstream" and len(odd.requests) == 1


def test_the_api_shows_where_a_credential_goes_and_never_its_secret(api, admin_user, db):
    body = {"name": "bmc", "username": "root", "secret": "s3cret-bmc-pass", "endpoints": ["https://bmc.example.org"]}
    created = api(admin_user).post("/api/v1/credentials/", body, format="json")
    assert created.status_code == 201 and created.json()["endpoints"] == ["https://bmc.example.org:443"]
    assert "s3cret-bmc-pass" not in created.content.decode()
    bad = api(admin_user).post("/api/v1/credentials/", {**body, "name": "b", "endpoints": ["nohost"]}, format="json")
    assert bad.status_code == 400 and "endpoints" in bad.json()["error"]["fields"]


def test_the_admin_changes_where_a_credential_goes_only_with_its_secret(client, admin_user, db):
    credential = services.create_credential(
        actor=TEST, name="bmc", username="root", secret=SECRET, endpoints=["https://bmc1.example.org"]
    )
    client.force_login(admin_user)
    url = f"/admin/inventory/credential/{credential.pk}/change/"
    assert "https://bmc1.example.org:443" in client.get(url).content.decode()
    form = {"name": "bmc", "username": "root", "endpoints": "https://bmc1.example.org\nhttp://listener.example.org"}
    refused = client.post(url, {**form, "secret": ""})
    assert refused.status_code == 200 and "give the secret again" in refused.content.decode()
    assert client.post(url, {**form, "secret": SECRET}).status_code == 302
    assert Credential.objects.get(pk=credential.pk).endpoints == [
        "http://listener.example.org:80",
        "https://bmc1.example.org:443",
    ]


@pytest.mark.django_db(transaction=True)
def test_the_migration_binds_each_credential_to_where_it_is_used_now():
    before, after = [("inventory", "0005_scheduled_state")], [("inventory", "0006_credential_endpoints")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    Login, Chassis, Host = (old.get_model("inventory", name) for name in ("Credential", "BladeCenter", "Hypervisor"))
    bmc, vc, _unused = (Login.objects.create(name=name) for name in ("bmc", "vc", "unused"))
    chassis = Chassis.objects.create(name="bc1", bmc_address="http://10.9.0.1:8000", bmc_credential=bmc)
    common = {"cpus": 1, "memory_mib": 1, "disk_gib": 1}
    Host.objects.create(name="blade", address="10.1.0.1", blade_center=chassis, slot=1, **common)
    Host.objects.create(
        name="own",
        address="10.1.0.2",
        bmc_address="https://BMC2.example.org/",
        bmc_credential=bmc,
        uri="https://vc.example.org/sdk?host=own",
        credential=vc,
        **common,
    )
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(after)
    new = executor.loader.project_state(after).apps
    bound = dict(new.get_model("inventory", "Credential").objects.values_list("name", "endpoints"))
    assert bound == {
        "bmc": ["http://10.9.0.1:8000", "https://bmc2.example.org:443"],
        "vc": ["https://vc.example.org:443"],
        "unused": [],
    }
    # A BMC reached over http:// with a credential keeps working; the https:// one needs nothing.
    assert new.get_model("inventory", "BladeCenter").objects.get().bmc_allow_http is True
    assert not new.get_model("inventory", "Hypervisor").objects.filter(bmc_allow_http=True).exists()
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert BladeCenter.objects.get().bmc_allow_http and Credential.objects.get(name="unused").endpoints == []
