from tests.reservations.conftest import image, sync_jobs  # noqa: F401 (fixtures)
