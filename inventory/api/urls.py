from rest_framework.routers import SimpleRouter

router = SimpleRouter(trailing_slash=True)

urlpatterns = [*router.urls]
