from django.urls import path

from reservations import approval_views, template_views, views

app_name = "reservations"

urlpatterns = [
    path("", views.reservation_list, name="list"),
    path("images/", views.catalogue, name="catalogue"),
    path("new/", views.reserve, name="reserve"),
    path("new/fit/", views.fit, name="fit"),
    path("environments/<int:pk>/new/", views.reserve_environment, name="reserve-environment"),
    path("<int:pk>/", views.reservation_detail, name="detail"),
    path("<int:pk>/panel/", views.reservation_panel, name="panel"),
    path("<int:pk>/extend/", views.extend, name="extend"),
    path("<int:pk>/end/", views.end, name="end"),
    path("<int:pk>/cancel/", views.cancel, name="cancel"),
    path("<int:pk>/suspend/", views.whole, {"verb": "suspend"}, name="suspend"),
    path("<int:pk>/resume/", views.whole, {"verb": "resume"}, name="resume"),
    path("<int:pk>/revert/", views.whole, {"verb": "revert"}, name="revert"),
    path("<int:pk>/connect.rdp", views.rdp, name="rdp"),
    path("blocks/", views.blocks, name="blocks"),
    path("blocks/<int:pk>/seat/", views.take_seat, name="take-seat"),
    path("blocks/<int:pk>/cancel/", views.cancel_block, name="cancel-block"),
    path("images/<int:pk>/template/", template_views.start, name="template-start"),
    path("images/<int:pk>/template/publish/", template_views.publish, name="template-publish"),
    path("images/<int:pk>/template/discard/", template_views.discard, name="template-discard"),
    path("revisions/<int:pk>/test/", template_views.test, name="revision-test"),
    path("approvals/", approval_views.queue, name="approvals"),
    path("approvals/<int:pk>/", approval_views.detail, name="approval"),
    path("approvals/<int:pk>/decide/", approval_views.decide, name="approval-decide"),
    path("usage/", views.usage_page, name="usage"),
    path("usage.csv", views.usage_csv, name="usage-csv"),
    path("showback/", views.showback_page, name="showback"),
    path("showback.csv", views.showback_csv, name="showback-csv"),
]
