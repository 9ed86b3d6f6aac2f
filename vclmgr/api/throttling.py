from django.core.cache import caches
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle


class AnonThrottle(AnonRateThrottle):
    cache = caches["throttle"]


class UserThrottle(UserRateThrottle):
    cache = caches["throttle"]
