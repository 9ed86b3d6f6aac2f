"""Jobs: Ganeti's job model on django-q2. The ``Job`` row is the truth; django-q2 only executes.

Everything that touches hypervisors runs as a job. Interfaces (web, API, CLI, other
services) only *submit* jobs (``services.submit``) and watch them.

Life of a job
    ``queued`` → (``waiting``) → ``running`` → ``success`` | ``error`` | ``canceled``

    queued    accepted, not started. ``waiting_for`` says why when the global limit or a
              rate-limit bucket holds it back.
    waiting   held by an unfinished dependency, by a lock another job holds (or is first in
              line for), or — after its own steps — by its unfinished child jobs.
    running   claimed by a worker; the worker holds a lease it keeps renewing.

Parts of a job
    opcode      a name in the registry (``registry.opcode``): the function that runs it, the
                parameter serializer (validated per field before anything is queued), the
                locks it takes, and whether only staff may submit it.
    params      JSON, as validated by the opcode's serializer.
    reason      the reason trail: ``[[source, reason, time], …]``; each layer that touches
                the job appends (interface, submit, expansion, execution); children inherit
                their parent's trail. A reason ``rate-limit:N:label`` puts the job (and its
                children) in the bucket of that exact reason string: at most N of its jobs
                run at once.
    depends     ``[[job_id, [statuses]], …]`` as in Ganeti: start only after each dependency
                finished in one of its accepted statuses (``[]`` = any final status). A
                dependency that ends otherwise fails the job at once, with the reason.
    locks       ``[[name, "shared"|"exclusive"], …]`` (``vm:7``, ``hypervisor:12``,
                ``cluster``). Any lock implies ``cluster`` shared, so ``cluster`` exclusive
                excludes every locking job. Lock waits are first-come first-served: a job
                never overtakes an earlier one waiting for a conflicting lock.
    priority    -20…20, higher first; equal priority runs in submission order.
    steps       completed steps and their results. A retried attempt replays them and
                resumes after the last completed one.
    log         ``JobLog`` rows (time, level, message); each one is an event, so it is live.

Dispatch (``dispatcher``): workers *pull*. A django-q2 task ``run_next`` is a wake-up
token: it claims the best startable job under one queue-wide lock (a row lock on
``QueueSettings`` on PostgreSQL; SQLite's IMMEDIATE write transactions serialize it there),
runs it, and in the transaction that ends it claims the next, while work is eligible.
Submitting a job (or anything that may unblock one: cancel, a higher limit) tops the
broker up to one waiting token per startable job, at most one per worker process. So a
job is ``running`` only while a worker really executes it, and the limit (stored in the
database, tunable at run time from admin, API and CLI) is never exceeded.

Crash safety (``runner``, ``tasks.sweep``): a running job holds a lease renewed after every
step and by a heartbeat thread while it runs. A janitor thread in every worker process
(started on django-q2's ``post_spawn``) and a once-a-minute django-q2 Schedule sweep
expired leases: the job goes back to ``queued`` and resumes from its last completed step,
or — after ``max_attempts`` — ends in ``error`` with the reason. Never left ``running``.
A job outlasting half of django-q2's task ``timeout`` hands itself to a fresh task between
steps, so django-q2's ``timeout`` (< ``retry``) never kills a healthy job; a single step must
finish within that half.

Expansion: an opcode may submit child jobs (``JobContext.submit_child``); after its own
steps it waits for them and ends ``success`` when all succeeded, else ``error`` with a
summary. Cancel: queued and waiting jobs at once; running ones between steps (children
too). Retry: a failed or canceled job is submitted again as a new job linked by
``retry_of``. Archive: finished jobs older than N days leave the default listings.

Events: every status change, progress step and log line is emitted (``core.events``) to
``job.<id>``, ``user.<submitter id>`` and ``admin``.
"""
