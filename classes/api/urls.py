from rest_framework.routers import SimpleRouter

from classes.api.views import ClassViewSet

router = SimpleRouter(trailing_slash=True)
router.register("classes", ClassViewSet, basename="class")

urlpatterns = router.urls
