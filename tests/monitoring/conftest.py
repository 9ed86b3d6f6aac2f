from tests.reservations.conftest import image, sim_host, sync_jobs  # noqa: F401 (fixtures)
