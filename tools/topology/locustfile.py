"""The client machine's load: students and admins, as locust users (``locust -f`` this file).

Students sign in through the login page, open the live-events socket on their own topic
(``user.<id>``), and for each of ``TOPO_CYCLES`` rounds reserve the lab image for now
(``POST /api/v1/reservations/`` with a request key, retried with the same key when the answer
was lost), wait on the socket for it to be ready (or failed), extend it, use it a moment and
end it, and wait on the socket for it to have ended; past those rounds they go on while the
file ``TOPO_HOLD`` exists (the faults are not over yet: every fault strikes under load).
Builders submit batch runs of the lab image (``POST /api/v1/runs/``) one after the other and
wait on the socket for each to end. Admins sign in, open the dashboard and poll its data, with
a socket on the ``admin`` topic, until the students are done.

Each socket resumes after a lost connection (a web machine restarting) from the last event
id it got, through the load balancer to whichever web machine answers; every session is
recorded (what it was owed is checked against the outbox afterwards). When every user is
done the run quits itself; ``TOPO_OUT`` receives what was recorded, as JSON.
"""

import json
import os
import time
import uuid
from datetime import UTC, datetime, timedelta

import gevent
import websocket
from gevent.queue import Empty, Queue
from locust import HttpUser, between, events, task
from locust.exception import StopUser

SPEC = json.loads(open(os.environ["TOPO_SPEC"]).read())  # noqa: SIM115 (read at import)
CYCLES = int(os.environ.get("TOPO_CYCLES", "2"))
HOLD = os.environ.get("TOPO_HOLD", "")
READY_TIMEOUT = float(os.environ.get("TOPO_READY_TIMEOUT", "150"))
RECORD = {
    "accepted": [], "ready": [], "failed": [], "sockets": [], "errors": [], "unanswered": 0,
    "runs": [], "runs_ended": [],
}  # fmt: skip
ACCOUNTS = {"student": Queue(), "admin": Queue(), "builder": Queue()}
for _kind in ACCOUNTS:
    for _account in SPEC.get(f"{_kind}s", []):
        ACCOUNTS[_kind].put(_account)
STUDENTS_LEFT = [len(SPEC["students"])]


def held():
    """The load must go on: the faults are not over."""
    return bool(HOLD) and os.path.exists(HOLD)


class Socket:
    """One subscriber's event stream across reconnects (a greenlet reads it)."""

    def __init__(self, user, topics, who):
        self.user, self.topics, self.who = user, topics, who
        self.since = None
        self.last = 0
        self.received = []
        self.servers = []
        self.resumes = []  # the since= of each reconnect
        self.events = Queue()
        self.closing = False
        self.ws = None
        self.greenlet = gevent.spawn(self._run)

    def _url(self):
        base = self.user.host.replace("http://", "ws://")
        query = f"topics={','.join(self.topics)}"
        if self.since is not None:
            resume = self.last if self.received else self.since
            self.resumes.append(resume)
            query += f"&since={resume}"
        return f"{base}/ws/events/?{query}"

    def _run(self):
        while not self.closing:
            try:
                cookies = "; ".join(f"{k}={v}" for k, v in self.user.client.cookies.items())
                self.ws = websocket.create_connection(
                    self._url(), header=[f"Cookie: {cookies}"], origin=self.user.host, timeout=30
                )
                self.servers.append(self.ws.getheaders().get("x-served-by", "?"))
                while not self.closing:
                    self._handle(json.loads(self.ws.recv()))
            except Exception as exc:
                if self.closing:
                    break
                RECORD["errors"].append(f"{self.who} socket: {type(exc).__name__}: {exc}"[:200])
                gevent.sleep(0.5)  # the load balancer moves us to the other web machine
            finally:
                if self.ws is not None:
                    try:
                        self.ws.close()
                    except Exception:
                        pass

    def _handle(self, message):
        if message.get("type") == "subscribed":
            if self.since is None:
                self.since = message["last_id"]
        elif message.get("type") == "event":
            self.received.append(message["id"])
            self.last = max(self.last, message["id"])
            self.events.put(message)

    def wait_subscribed(self, timeout=30):
        deadline = time.monotonic() + timeout
        while self.since is None and time.monotonic() < deadline:
            gevent.sleep(0.05)
        return self.since is not None

    def wait_for(self, reservation_id, statuses, timeout, kind="reservation.changed", key="id", field="status"):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                message = self.events.get(timeout=left)
            except Empty:
                return None
            data = message.get("data", {})
            if message.get("kind") == kind and data.get(key) == reservation_id:
                if data.get(field) in statuses:
                    return data

    def close(self, grace=2.0):
        gevent.sleep(grace)  # what was committed just before is still on its way
        self.closing = True
        if self.ws is not None:
            try:
                self.ws.close()
            except Exception:
                pass
        self.greenlet.join(timeout=5)
        RECORD["sockets"].append(
            {
                "who": self.who,
                "topics": self.topics,
                "since": self.since or 0,
                "last": self.last,
                "received": self.received,
                "servers": self.servers,
                "resumes": self.resumes,
                "closed": time.time(),
            }
        )


class SignedIn(HttpUser):
    abstract = True
    kind = None

    def on_start(self):
        self.account = ACCOUNTS[self.kind].get()
        self.client.get("/login/", name="/login/")
        token = self.client.cookies.get("csrftoken")
        with self.client.post(
            "/login/",
            data={
                "username": self.account["username"],
                "password": self.account["password"],
                "csrfmiddlewaretoken": token,
            },
            name="/login/ POST",
            allow_redirects=False,
            catch_response=True,
        ) as answer:
            if answer.status_code != 302:
                answer.failure(f"login answered {answer.status_code}")
                why = f"{answer.status_code} {getattr(answer, 'error', '') or ''}"[:200]
                RECORD["errors"].append(f"{self.account['username']}: login answered {why}")
                self.socket = None
                raise StopUser()
        self.socket = Socket(self, self.topics(), self.account["username"])
        if not self.socket.wait_subscribed():
            RECORD["errors"].append(f"{self.account['username']}: socket never subscribed")

    def topics(self):
        """What its socket follows: its own events."""
        return [f"user.{self.account['id']}"]

    def on_stop(self):
        if getattr(self, "socket", None):
            self.socket.close()

    def api(self, method, path, name, body=None, tries=6):
        """An API call; a lost answer or a 5xx (a web machine going away) is tried again."""
        headers = {"X-CSRFToken": self.client.cookies.get("csrftoken", ""), "Referer": self.host + "/"}
        for attempt in range(tries):
            with self.client.request(
                method, path, json=body, headers=headers, name=name, catch_response=True
            ) as answer:
                if answer.status_code and answer.status_code < 500:
                    if answer.status_code >= 400:
                        answer.failure(f"{answer.status_code}: {answer.text[:200]}")
                    return answer
                answer.failure(f"{answer.status_code or 'no answer'}")
            RECORD["unanswered"] += 1
            gevent.sleep(0.5 * (attempt + 1))
        return None


class Student(SignedIn):
    kind = "student"
    wait_time = between(0.5, 2)

    def on_start(self):
        self.cycles = 0
        super().on_start()

    def on_stop(self):
        super().on_stop()
        STUDENTS_LEFT[0] -= 1

    @task
    def cycle(self):
        if self.cycles >= CYCLES and not held():
            raise StopUser()
        self.cycles += 1
        body = {"image": SPEC["image"], "duration_minutes": 60, "request_key": uuid.uuid4().hex}
        answer = self.api("POST", "/api/v1/reservations/", "reserve", body)
        if answer is None or answer.status_code not in (200, 201, 202):
            return
        reservation = answer.json()["reservation"]
        rid, accepted = reservation["id"], time.time()
        RECORD["accepted"].append(rid)
        got = self.socket.wait_for(rid, ("ready", "failed"), READY_TIMEOUT)
        if got is None:
            RECORD["errors"].append(f"reservation {rid}: no ready/failed event within {READY_TIMEOUT}s")
            return
        if got["status"] == "failed":
            RECORD["failed"].append({"id": rid, "error": got.get("error", "")})
            return
        RECORD["ready"].append({"id": rid, "accepted": accepted, "ready": time.time()})
        end = (datetime.now(UTC) + timedelta(minutes=90)).isoformat()
        self.api("POST", f"/api/v1/reservations/{rid}/extend/", "extend", {"end": end})
        gevent.sleep(1.0)  # the student works a moment
        if self.api("POST", f"/api/v1/reservations/{rid}/end/", "end") is None:
            return
        if self.socket.wait_for(rid, ("ended", "failed"), READY_TIMEOUT) is None:
            RECORD["errors"].append(f"reservation {rid}: no ended event within {READY_TIMEOUT}s")


class Builder(SignedIn):
    """A build farm's client: one batch run after another while the students work."""

    kind = "builder"
    wait_time = between(0.5, 1.5)

    @task
    def build(self):
        if STUDENTS_LEFT[0] <= 0:
            raise StopUser()
        body = {"image": SPEC["image"], "argv": ["make", "test"], "time_limit": 300, "reason": "topology build"}
        # No retry: a run has no request key, so a lost answer is not sent again (the check
        # counts every run in the database, recorded or not).
        answer = self.api("POST", "/api/v1/runs/", "run", body, tries=1)
        if answer is None or answer.status_code != 202:
            return
        run = answer.json()["run"]["id"]
        RECORD["runs"].append(run)
        got = self.socket.wait_for(
            run, ("success", "error", "canceled"), READY_TIMEOUT * 2, kind="run.changed", key="run", field="state"
        )
        if got is None:
            RECORD["errors"].append(f"run {run}: no end event within {READY_TIMEOUT * 2}s")
            return
        RECORD["runs_ended"].append({"id": run, "state": got["state"], "exit_status": got.get("exit_status")})


class Admin(SignedIn):
    kind = "admin"
    wait_time = between(2, 4)
    weight = 0  # spawned by count: fixed_count below

    def topics(self):
        return ["admin"]

    def on_start(self):
        super().on_start()
        self.client.get("/", name="dashboard")

    @task
    def look(self):
        if STUDENTS_LEFT[0] <= 0:
            raise StopUser()
        self.client.get("/dashboard/data/", name="dashboard data")


Admin.fixed_count = len(SPEC["admins"])
Student.fixed_count = len(SPEC["students"])
Builder.fixed_count = len(SPEC.get("builders", []))


def _quit_when_done(environment):
    gevent.sleep(5)
    while environment.runner.user_count > 0:
        gevent.sleep(0.5)
    environment.runner.quit()


@events.test_start.add_listener
def _started(environment, **kwargs):
    gevent.spawn(_quit_when_done, environment)


@events.quitting.add_listener
def _write(environment, **kwargs):
    with open(os.environ["TOPO_OUT"], "w") as out:
        json.dump(RECORD, out)
