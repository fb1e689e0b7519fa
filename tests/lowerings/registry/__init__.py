"""The registry: backends and their plugins, the preference, the errors a user sees."""
