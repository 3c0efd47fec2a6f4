"""The qualification suite shipped with the plugin (``pytest --pyargs pytest_nvrx.suite``)."""
