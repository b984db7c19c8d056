import missing_dependency_of_broken_task  # noqa: F401  (the failure under test)
