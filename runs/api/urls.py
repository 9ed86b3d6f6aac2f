from rest_framework.routers import SimpleRouter

from runs.api.views import RunViewSet

router = SimpleRouter(trailing_slash=True)
router.register("runs", RunViewSet, basename="run")

urlpatterns = router.urls
