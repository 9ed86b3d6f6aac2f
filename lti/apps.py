from django.apps import AppConfig


class LtiConfig(AppConfig):
    """LTI 1.3: vclmgr as a tool of an LMS (Canvas, Moodle, Blackboard): a launch signs the user in
    on the course's group and lands on its course page; the roster follows the LMS's (NRPS)."""

    name = "lti"
    verbose_name = "LTI"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from accounts import access
        from classes import views as course_pages
        from lti import teaching, views

        course_pages.COURSE_CARDS.register(views.course_card)
        access.COURSE_TEACHERS.register(teaching.course_teachers)
