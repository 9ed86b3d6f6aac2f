app_name = "provisioning"

urlpatterns = []
