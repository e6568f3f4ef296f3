"""TaskFlow decorators: ``@task.systemzero`` and ``@task.systemzero_branch`` (registered through
the provider info's ``task-decorators``)."""
