"""Models of the provisioning app."""

from provisioning.jobs.models import Job, JobDependency, JobLog, QueueSettings

__all__ = ["Job", "JobDependency", "JobLog", "QueueSettings"]
