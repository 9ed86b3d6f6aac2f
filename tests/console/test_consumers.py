"""The console websockets on a real daphne server: a ticket opens one socket of its own user,
once; everything else is closed with 4403 and the reason, and a console the host cannot give
(the sim driver's) with 4404 and what the driver said. (The bridges themselves, to a real QEMU
guest's VNC display and serial console, are tests/e2e/test_console_real_vm.py.)"""

import pytest

from console import services
from console.consumers import REFUSED_PREFIX
from console.models import ConsoleTicket
from tests.console.test_services import sim_vm  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow


def closed_with(said):
    """The close code and the reason the server sent just before it."""
    code, texts = said
    assert len(texts) == 1 and texts[0].startswith(REFUSED_PREFIX) and texts[0].endswith("]\r\n"), texts
    return code, texts[0].removeprefix(REFUSED_PREFIX).removesuffix("]\r\n")


def test_a_ticket_opens_one_socket_of_its_user_once(ws_refusal, session_cookie, sim_vm, alice, bob):  # noqa: F811
    path = f"/ws/console/{sim_vm.pk}/serial/?ticket="
    ticket = services.issue(alice, sim_vm, "serial")
    code, reason = closed_with(ws_refusal(path + ticket, cookie=session_cookie(bob)))
    assert (code, reason) == (4403, "this console ticket was issued to another user")
    code, reason = closed_with(ws_refusal(path + ticket))  # no session
    assert (code, reason) == (4403, "not signed in")
    code, reason = closed_with(ws_refusal(path + ticket, cookie=session_cookie(alice)))
    assert code == 4404 and "simulated VM" in reason  # spent, and the sim driver says why there is none
    assert ConsoleTicket.objects.get().used is not None
    code, reason = closed_with(ws_refusal(path + ticket, cookie=session_cookie(alice)))
    assert (code, reason) == (4403, "this console ticket was used already")
    vnc = f"/ws/console/{sim_vm.pk}/vnc/?ticket=nonsense"
    code, reason = closed_with(ws_refusal(vnc, cookie=session_cookie(alice)))
    assert (code, reason) == (4403, "unknown console ticket")
