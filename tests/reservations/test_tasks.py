from django_q.models import Schedule

from reservations import tasks


def test_the_clock_schedule_is_made_once(db):
    tasks.ensure_schedule()
    tasks.ensure_schedule()
    Schedule.objects.create(name=tasks.TICK_SCHEDULE, func=tasks.TICK_FUNC, schedule_type=Schedule.MINUTES, minutes=1)
    tasks.ensure_schedule()  # a duplicate (two workers at once) is removed
    schedule = Schedule.objects.get(name=tasks.TICK_SCHEDULE)
    assert schedule.func == "reservations.tasks.tick" and schedule.minutes == 1 and schedule.repeats == -1


def test_the_scheduled_function_ticks(db):
    assert tasks.tick() == {"started": 0, "ended": 0, "warned": 0, "expired": 0, "refinished": 0}
