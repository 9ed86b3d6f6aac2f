app_name = "reservations"

urlpatterns = []
