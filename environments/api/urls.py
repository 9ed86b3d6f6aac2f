from rest_framework.routers import SimpleRouter

from environments.api.views import TemplateViewSet

router = SimpleRouter(trailing_slash=True)
router.register("environments", TemplateViewSet, basename="environment")

urlpatterns = router.urls
