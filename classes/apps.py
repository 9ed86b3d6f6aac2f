from django.apps import AppConfig


class ClassesConfig(AppConfig):
    """Courses: a course group's page, its classes with a term (sessions, holidays, seats)."""

    name = "classes"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django_q.signals import post_spawn

        from classes import budget, services, tasks, warming
        from provisioning import warm
        from reservations import approvals, reserving, showback
        from reservations.models import ApprovalRequest

        reserving.BUDGETS.register(budget.check)
        approvals.PROCEED.register(ApprovalRequest.Kind.CLASS, services.proceed_approved)
        showback.CLASS_OF_BLOCKS.register(services.class_of_blocks)
        showback.TAUGHT_CLASSES.register(services.taught_classes)
        showback.CLASS_BUDGETS.register(services.hours_budgets)
        showback.STUDENT_BUDGETS.register(budget.standings)
        warm.AHEAD.register(warming.ahead)  # a session's seats warmed before they are built
        post_spawn.connect(tasks.start_planner, dispatch_uid="classes.planner")
