from django.urls import path

from jobs import views

app_name = "jobs"

urlpatterns = [
    path("jobs/", views.job_list, name="job-list"),
    path("jobs/submit/", views.job_submit, name="job-submit"),
    path("jobs/<int:pk>/", views.job_detail, name="job-detail"),
    path("jobs/<int:pk>/cancel/", views.job_cancel, name="job-cancel"),
    path("jobs/<int:pk>/retry/", views.job_retry, name="job-retry"),
    path("queue/", views.queue_update, name="queue-update"),
]
