from django.apps import AppConfig


class ClassesConfig(AppConfig):
    """Courses: a course group's page, its classes with a term (sessions, holidays, seats)."""

    name = "classes"
    default_auto_field = "django.db.models.BigAutoField"
